"""Extractors of ``endpoint-notification-source`` (:mod:`epp.datalayer.endpoint_events`) that
want the pool's endpoint *set* rather than single events: ``precise-prefix-cache-scorer``
opens a KV-event subscriber for each endpoint that joins and closes it when it leaves."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from epp.datalayer.plugin import Extractor
from epp.datastore import EndpointView

#: The data type ``endpoint-notification-source`` emits (here, not in
#: :mod:`epp.datalayer.endpoint_events`, which imports this module).
ENDPOINT_EVENTS = "endpoint-events"


class EndpointSetExtractor(Extractor):
    """An extractor fed by ``endpoint-notification-source``: it sees the pool's endpoint
    set, not per-endpoint data (``extract`` is not called)."""

    input_type = ENDPOINT_EVENTS

    def extract(self, data: Any, view: EndpointView, now: float) -> Any:
        """Unused: notifications arrive through :meth:`endpoints_changed`."""
        return None

    def open(self) -> None:
        """Called once by the EPP before it serves (not by ``--check-config``): acquire what
        must not fail later, such as a socket to bind. Raise ValueError to refuse to start;
        the message is printed as is."""

    @abstractmethod
    async def endpoints_changed(self, endpoints: Sequence[EndpointView]) -> None:
        """The pool now holds exactly ``endpoints`` (start/stop per-endpoint work)."""

    async def close(self) -> None:
        """The source stops: release per-endpoint resources (override when there are any)."""


__all__ = ["ENDPOINT_EVENTS", "EndpointSetExtractor"]
