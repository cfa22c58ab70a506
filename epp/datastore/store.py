"""The datastore: the current :class:`Snapshot` plus live per-endpoint state.

Sources call :meth:`Datastore.replace` with a whole new snapshot (atomic: readers see the old
or the new one, never a mix). The scraper writes metrics through :meth:`record_scrape` /
:meth:`record_scrape_failure`. The request path reads :meth:`candidates` and counts in-flight
requests on the returned :class:`EndpointView` objects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from epp.datastore.endpoint_state import EndpointMetrics, EndpointView
from epp.datastore.snapshot import Snapshot

#: Called after every :meth:`Datastore.replace` with the new snapshot.
SnapshotListener = Callable[[Snapshot], None]

DEFAULT_FAILURE_THRESHOLD = 3

log = structlog.get_logger(__name__)


class Datastore:
    """Holds what one EPP serves from; safe to share across tasks of one event loop."""

    def __init__(self, *, failure_threshold: int = DEFAULT_FAILURE_THRESHOLD) -> None:
        self._snapshot = Snapshot()
        self._views: dict[str, EndpointView] = {}
        self._all: tuple[EndpointView, ...] = ()
        self._candidates: tuple[EndpointView, ...] = ()
        self._listeners: list[SnapshotListener] = []
        self.failure_threshold = failure_threshold
        #: Set once the first snapshot has been installed (gRPC health waits for it).
        self.synced = asyncio.Event()
        self._empty_warned = False

    # -- snapshot ----------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The current snapshot (immutable; keep the reference for a whole request)."""
        return self._snapshot

    @property
    def is_synced(self) -> bool:
        """True once a source installed its first snapshot."""
        return self.synced.is_set()

    def replace(self, snapshot: Snapshot) -> None:
        """Install ``snapshot``; endpoints that stay keep their metrics and in-flight counts."""
        views: dict[str, EndpointView] = {}
        for ep in snapshot.endpoints:
            view = self._views.get(ep.key)
            if view is None:
                view = EndpointView(ep)
            elif view.endpoint != ep:
                view.endpoint = ep  # labels/engine changed; the live counters stay valid
            views[ep.key] = view
        self._snapshot = snapshot
        self._views = views
        self._all = tuple(views.values())
        self._refresh_candidates()
        self.synced.set()
        self._warn_when_empty(snapshot)
        for listener in list(self._listeners):
            listener(snapshot)

    def _warn_when_empty(self, snapshot: Snapshot) -> None:
        """One warning when the pool has no endpoint (every request gets 503 until one is
        ready), one info line when it has some again. Health stays SERVING, as upstream:
        the EPP still answers each request with the right JSON 503 itself."""
        pool = snapshot.pool
        if pool is not None and not snapshot.endpoints and not self._empty_warned:
            self._empty_warned = True
            log.warning("pool has no ready endpoints: requests get 503 until one is ready",
                        pool=f"{pool.ref.namespace}/{pool.ref.name}",
                        selector=pool.selector, target_ports=list(pool.target_ports))
        elif snapshot.endpoints and self._empty_warned:
            self._empty_warned = False
            log.info("pool has ready endpoints again", endpoints=len(snapshot.endpoints))

    def subscribe(self, listener: SnapshotListener) -> None:
        """Call ``listener(snapshot)`` after every replace (e.g. the scraper's reconcile)."""
        self._listeners.append(listener)

    # -- endpoints -----------------------------------------------------------------------

    def views(self) -> tuple[EndpointView, ...]:
        """Every endpoint of the pool, healthy or not (same order as the snapshot)."""
        return self._all

    def candidates(self) -> tuple[EndpointView, ...]:
        """Endpoints the scheduler may pick: all but those whose scrapes keep failing with
        nothing to serve on (never read, or the server refuses connections).

        Cached; rebuilt only when the snapshot or an endpoint's health changes.
        """
        return self._candidates

    def view(self, key: str) -> EndpointView | None:
        """The live view of endpoint ``ip:port``, if it is in the pool."""
        return self._views.get(key)

    # -- written by the scraper ----------------------------------------------------------

    def record_scrape(self, view: EndpointView, metrics: EndpointMetrics) -> None:
        """A scrape of ``view`` succeeded."""
        was_healthy = view.healthy
        view.apply_scrape(metrics)
        if not was_healthy and view.key in self._views:
            self._refresh_candidates()

    def record_scrape_failure(self, view: EndpointView, *, refused: bool = False) -> bool:
        """A scrape of ``view`` failed (``refused``: the server refused the connection);
        True when that made it unhealthy (see :meth:`EndpointView.record_scrape_failure`)."""
        flipped = view.record_scrape_failure(self.failure_threshold, refused=refused)
        if flipped and view.key in self._views:
            self._refresh_candidates()
        return flipped

    def _refresh_candidates(self) -> None:
        self._candidates = tuple(v for v in self._all if v.healthy)
