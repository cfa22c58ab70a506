"""Per-endpoint live state: the latest scrape and the EPP's own in-flight counters.

An :class:`EndpointView` is one long-lived object per endpoint key. The scraper replaces its
:class:`EndpointMetrics` (one immutable object per scrape); the request path bumps its
in-flight counters. The scheduler only reads it. Everything runs on one event loop and
scheduling is synchronous, so a pick always sees a consistent view without locks or copies —
which is what keeps a 1,000-endpoint pick allocation-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

from epp.datastore.models import Endpoint

A = TypeVar("A")


@dataclass(frozen=True, slots=True)
class LoraInfo:
    """LoRA adapters a server reports (``vllm:lora_requests_info``)."""

    max_lora: int
    running: frozenset[str] = frozenset()
    waiting: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class EndpointMetrics:
    """One successful scrape of a model server, already in engine-neutral terms."""

    waiting: int = 0
    running: int = 0
    #: KV-cache usage as a fraction in [0, 1].
    kv_usage: float = 0.0
    lora: LoraInfo | None = None
    #: KV block size in tokens and number of GPU blocks, when the server reports them.
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    #: Model names the server labels its gauges with (``model_name``): the served base model.
    models: frozenset[str] = frozenset()
    #: ``time.monotonic()`` when the scrape finished; 0.0 = never scraped.
    updated_at: float = 0.0


#: What an endpoint looks like before its first scrape: idle and infinitely stale.
NO_METRICS = EndpointMetrics()


@dataclass(slots=True, eq=False)
class EndpointView:
    """The live view of one endpoint, as the scheduler reads it.

    ``queue`` is the load signal scorers use: the scraped waiting queue plus requests this
    EPP sent since the latest scrape began and that are still in flight. Without that term
    every pick between two scrapes (50 ms) would see the same numbers and pile onto the same
    endpoint. A request counts as "not yet reflected" when it was picked after the scrape
    that produced the current metrics was *sent*; it stops counting once it ends (then it is
    in neither the server's numbers nor ours).

    With active-active replicas (docs/active-active.md) the other replicas' in-flight counts
    arrive from the state store (:meth:`set_remote_inflight`, at most a sync old): they are
    added to ``inflight_requests``/``inflight_tokens``, and their growth since the current
    metrics' scrape was sent counts in ``queue`` as their not-yet-reflected picks.
    """

    endpoint: Endpoint
    metrics: EndpointMetrics = NO_METRICS
    #: Requests / estimated tokens routed here that have not finished yet: this EPP's, plus
    #: the other active-active replicas' (``remote_requests``/``remote_tokens``).
    inflight_requests: int = 0
    inflight_tokens: int = 0
    #: Estimated prompt tokens this EPP routed here whose first token has not come back: the
    #: prompt work still ahead of or in the server's prefill (``inflight-load-producer``).
    prefill_tokens: int = 0
    remote_requests: int = 0
    remote_tokens: int = 0
    #: Scraped ``waiting`` + picks not yet reflected by a scrape (see the class docstring).
    queue: int = 0
    #: False (excluded from the candidates) after ``failure_threshold`` scrapes in a row
    #: failed while there was nothing to serve on: see :meth:`record_scrape_failure`.
    healthy: bool = True
    consecutive_failures: int = 0
    #: Typed attributes data-layer extractors add beside the core metrics, keyed by their
    #: class (read with :meth:`attribute`).
    attributes: dict[type, Any] = field(default_factory=dict, repr=False)
    _picks: int = field(default=0, repr=False)
    _picks_at_scrape_start: int = field(default=0, repr=False)
    _picks_reflected: int = field(default=0, repr=False)
    _remote_at_scrape_start: int = field(default=0, repr=False)
    _remote_reflected: int = field(default=0, repr=False)

    @property
    def key(self) -> str:
        """``ip:port`` of the endpoint."""
        return self.endpoint.key

    @property
    def unreflected_picks(self) -> int:
        """Requests routed here after the current metrics' scrape was sent, still running."""
        own = self.inflight_requests - self.remote_requests
        return min(self._picks - self._picks_reflected, own)

    @property
    def unreflected_remote(self) -> int:
        """Growth of the other replicas' in-flight requests since the current metrics'
        scrape was sent (their picks the scrape cannot show yet)."""
        return max(0, self.remote_requests - self._remote_reflected)

    def attribute(self, kind: type[A]) -> A | None:
        """The latest attribute of class ``kind`` an extractor installed (None if none)."""
        value = self.attributes.get(kind)
        return value if isinstance(value, kind) else None

    @property
    def ever_scraped(self) -> bool:
        """True once a scrape succeeded: there are metrics to serve on, however old."""
        return self.metrics.updated_at != 0.0

    def age(self, now: float) -> float:
        """Seconds since the latest successful scrape (``inf`` if never scraped)."""
        updated = self.metrics.updated_at
        return math.inf if updated == 0.0 else now - updated

    # -- written by the request path -------------------------------------------------

    def start_request(self, tokens: int = 0) -> None:
        """Count a request routed here (call once per picked request, at pick time)."""
        self._picks += 1
        self.inflight_requests += 1
        self.inflight_tokens += tokens
        self._update_queue()

    def end_request(self, tokens: int = 0) -> None:
        """Count a request finished (response end, error or stream break); never below 0."""
        self.inflight_requests = max(self.remote_requests, self.inflight_requests - 1)
        self.inflight_tokens = max(self.remote_tokens, self.inflight_tokens - tokens)
        self._update_queue()

    def set_remote_inflight(self, requests: int, tokens: int) -> None:
        """The other replicas' in-flight counts here, as the state store last pulled them."""
        self.inflight_requests += requests - self.remote_requests
        self.inflight_tokens += tokens - self.remote_tokens
        self.remote_requests, self.remote_tokens = requests, tokens
        self._update_queue()

    # -- written by the scraper ------------------------------------------------------

    def begin_scrape(self) -> None:
        """Mark the moment a scrape request is sent: picks before it will be reflected."""
        self._picks_at_scrape_start = self._picks
        self._remote_at_scrape_start = self.remote_requests

    def apply_scrape(self, metrics: EndpointMetrics) -> None:
        """Install a successful scrape's metrics; the endpoint is healthy again."""
        self.metrics = metrics
        self._picks_reflected = self._picks_at_scrape_start
        self._remote_reflected = self._remote_at_scrape_start
        self.consecutive_failures = 0
        self.healthy = True
        self._update_queue()

    def record_scrape_failure(self, failure_threshold: int, *, refused: bool = False) -> bool:
        """Count a failed scrape; returns True when this failure made the endpoint unhealthy.

        A scrape that times out or gets an error page does not take the endpoint out (as
        upstream, it is served on its last metrics, which go stale). It leaves the
        candidates after ``failure_threshold`` failures in a row only when there is nothing
        to serve on: its metrics were never read, or the server ``refused`` the connection
        (the server is down, not only its ``/metrics``)."""
        self.consecutive_failures += 1
        if (self.healthy and self.consecutive_failures >= failure_threshold
                and (refused or not self.ever_scraped)):
            self.healthy = False
            return True
        return False

    def _update_queue(self) -> None:
        self.queue = self.metrics.waiting + self.unreflected_picks + self.unreflected_remote
