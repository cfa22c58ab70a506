"""``endpoint-notification-source``: endpoint lifecycle events (an endpoint joined, changed,
or left the pool) for extractor plugins that keep their own per-endpoint state, as upstream's
source of the same name does. Extractors are :class:`EndpointExtractor` plugins (a
third-party package's, through the ``inference_gateway.plugins`` entry points)::

    plugins:
    - type: endpoint-notification-source
    - type: my-endpoint-extractor
    dataLayer:
      sources:
      - pluginRef: endpoint-notification-source
        extractors: [{pluginRef: my-endpoint-extractor}]
"""

from __future__ import annotations

import asyncio
import enum
import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import structlog

from epp.datalayer.endpoint_notification import ENDPOINT_EVENTS, EndpointSetExtractor
from epp.datalayer.plugin import DataSource, Extractor
from epp.datastore import Datastore, Endpoint, EndpointView, Snapshot
from epp.scheduling.plugin import Plugin

log = structlog.get_logger(__name__)


class EventKind(enum.Enum):
    ADDED = "added"
    UPDATED = "updated"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class EndpointEvent:
    """One change: ``view`` is the live endpoint (None once it was deleted)."""

    kind: EventKind
    endpoint: Endpoint
    view: EndpointView | None


class EndpointExtractor(Extractor):
    """Receives every :class:`EndpointEvent` of the pool, in order."""

    input_type = ENDPOINT_EVENTS

    @abstractmethod
    def on_endpoint_event(self, event: EndpointEvent) -> None:
        """Called on the event loop; keep it short."""

    def extract(self, data: Any, view: EndpointView, now: float) -> None:
        self.on_endpoint_event(data)


class EndpointNotificationSource(Plugin, DataSource):
    """Compares each new snapshot of the pool with the previous one: endpoints not seen
    before are ``added``, those whose object (labels, ports, engine...) changed are
    ``updated``, those gone are ``deleted``. The endpoints present at start arrive as
    ``added``. An extractor that raises is logged and the others still run."""

    type_name = "endpoint-notification-source"
    output_type = ENDPOINT_EVENTS

    def __init__(self, name: str = "", params: Any = None) -> None:
        Plugin.__init__(self, name, params)
        DataSource.__init__(self)
        self._known: dict[str, Endpoint] = {}

    def on_snapshot(self, datastore: Datastore, snapshot: Snapshot) -> None:
        """Dispatch the differences between ``snapshot`` and the previous one."""
        now = {e.key: e for e in snapshot.endpoints}
        events = [EndpointEvent(EventKind.DELETED, e, None)
                  for key, e in self._known.items() if key not in now]
        for key, e in now.items():
            before = self._known.get(key)
            if before is None or before != e:
                kind = EventKind.ADDED if before is None else EventKind.UPDATED
                events.append(EndpointEvent(kind, e, datastore.view(key)))
        self._known = now
        stamp = time.monotonic()
        for event in events:
            for extractor in self.extractors:
                try:
                    extractor.extract(event, event.view, stamp)  # type: ignore[arg-type]
                except Exception:
                    log.exception("endpoint extractor failed", extractor=repr(extractor),
                                  event=event.kind.value, endpoint=event.endpoint.key)

    async def run(self, datastore: Datastore) -> None:
        changed = asyncio.Event()

        def on_change(snapshot: Snapshot) -> None:
            self.on_snapshot(datastore, snapshot)
            changed.set()

        datastore.subscribe(on_change)
        self.on_snapshot(datastore, datastore.snapshot)
        sets = [e for e in self.extractors if isinstance(e, EndpointSetExtractor)]
        seen: tuple[str, ...] | None = None
        try:
            while True:  # set extractors: the pool's endpoint set, whenever it changes
                views = datastore.views()
                keys = tuple(v.endpoint.key for v in views)
                if keys != seen:
                    seen = keys
                    for extractor in sets:
                        try:
                            await extractor.endpoints_changed(views)
                        except Exception as e:  # one broken extractor must not stop it
                            log.warning("endpoint notification failed",
                                        extractor=repr(extractor), error=str(e))
                changed.clear()
                await changed.wait()
        finally:
            for extractor in sets:
                await extractor.close()
