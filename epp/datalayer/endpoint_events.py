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

from epp.datalayer.plugin import DataSource, Extractor
from epp.datastore import Datastore, Endpoint, EndpointView, Snapshot
from epp.scheduling.plugin import Plugin

log = structlog.get_logger(__name__)

ENDPOINT_EVENTS = "endpoint-events"


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
        datastore.subscribe(lambda snap: self.on_snapshot(datastore, snap))
        self.on_snapshot(datastore, datastore.snapshot)
        await asyncio.Event().wait()
