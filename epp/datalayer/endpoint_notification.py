"""``endpoint-notification-source``: tells its extractors when endpoints join or leave the
pool (llm-d's source of the same name). ``precise-prefix-cache-scorer`` is such an extractor:
it opens a KV-event subscriber for each endpoint that joins and closes it when it leaves."""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import structlog

from epp.datalayer.plugin import DataSource, Extractor
from epp.datastore import Datastore, EndpointView
from epp.scheduling.plugin import Plugin

log = structlog.get_logger(__name__)

ENDPOINT_NOTIFICATIONS = "endpoint-notification"


class EndpointExtractor(Extractor):
    """An extractor fed by :class:`EndpointNotificationSource`: it sees the pool's endpoint
    set, not per-endpoint data (``extract`` is not called)."""

    input_type = ENDPOINT_NOTIFICATIONS

    def extract(self, data: Any, view: EndpointView, now: float) -> Any:
        """Unused: notifications arrive through :meth:`endpoints_changed`."""
        return None

    @abstractmethod
    async def endpoints_changed(self, endpoints: Sequence[EndpointView]) -> None:
        """The pool now holds exactly ``endpoints`` (start/stop per-endpoint work)."""

    async def close(self) -> None:
        """The source stops: release per-endpoint resources (override when there are any)."""


class EndpointNotificationSource(Plugin, DataSource):
    """Calls each extractor's ``endpoints_changed`` once at start and after every datastore
    change that alters the endpoint set."""

    type_name = "endpoint-notification-source"
    output_type = ENDPOINT_NOTIFICATIONS

    def __init__(self, name: str = "", params: Any = None) -> None:
        Plugin.__init__(self, name, params)
        DataSource.__init__(self)

    async def run(self, datastore: Datastore) -> None:
        changed = asyncio.Event()
        datastore.subscribe(lambda _snapshot: changed.set())
        seen: tuple[str, ...] | None = None
        try:
            while True:
                views = datastore.views()
                keys = tuple(v.endpoint.key for v in views)
                if keys != seen:
                    seen = keys
                    for extractor in self.extractors:
                        if isinstance(extractor, EndpointExtractor):
                            try:
                                await extractor.endpoints_changed(views)
                            except Exception as e:  # one broken extractor must not stop it
                                log.warning("endpoint notification failed",
                                            extractor=repr(extractor), error=str(e))
                changed.clear()
                await changed.wait()
        finally:
            for extractor in self.extractors:
                if isinstance(extractor, EndpointExtractor):
                    await extractor.close()


__all__ = ["ENDPOINT_NOTIFICATIONS", "EndpointExtractor", "EndpointNotificationSource"]
