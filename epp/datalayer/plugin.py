"""Data-layer extension points (upstream's ``dataLayer`` config section).

A :class:`DataSource` collects raw data about endpoints (a ``/metrics`` page, a stream of
KV-cache events...) for as long as the EPP runs; each of its :class:`Extractor` plugins turns
that raw data into typed endpoint attributes in the datastore (for ``/metrics``: an
:class:`epp.datastore.EndpointMetrics`), which every filter, scorer and producer reads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from epp.datastore import Datastore, EndpointView


class Extractor(ABC):
    """Turns one data source's raw data for one endpoint into a typed attribute."""

    #: What the extractor reads (a data source refuses an extractor of another input).
    input_type: ClassVar[str] = ""

    @abstractmethod
    def extract(self, data: Any, view: EndpointView, now: float) -> Any:
        """The attribute made from ``data`` (the source installs it on ``view``)."""


class DataSource(ABC):
    """Collects data about the pool's endpoints while :meth:`run` runs."""

    #: What the source hands its extractors (see :attr:`Extractor.input_type`).
    output_type: ClassVar[str] = ""

    def __init__(self) -> None:
        self.extractors: list[Extractor] = []

    def add_extractor(self, extractor: Extractor) -> None:
        """Wire ``extractor`` to this source; ValueError when it reads another input."""
        if extractor.input_type != self.output_type:
            raise ValueError(f"reads {extractor.input_type or 'nothing'}, but the source "
                             f"gives {self.output_type}")
        self.extractors.append(extractor)

    @abstractmethod
    async def run(self, datastore: Datastore) -> None:
        """Collect until cancelled, writing what the extractors make into ``datastore``."""


__all__ = ["DataSource", "Extractor"]
