"""In-flight eviction (``flowControl.enableEviction``, llm-d-router v0.10): when the pool is
saturated and a band waits behind it, requests already sent to the pool whose priority is
below that band's (sheddable ones, by default) are ended to give their capacity back.

- :class:`SheddableEvictionFilter` (``sheddable-eviction-filter``): which in-flight requests
  may be evicted at all: priority < 0;
- :class:`PriorityThenTimeEvictionOrder` (``priority-then-time-eviction-order-policy``): which
  goes first: the lowest priority, then the most recently dispatched (least sunk KV work);
- :class:`RequestEvictor`: the requests in flight that the filter accepts, and ending them;
- :class:`Reclamation`: how many to end and how often (the pacing below).

Pacing (upstream's reclamation controller, same constants): each eligible in-flight request
is credited an equal share of the saturation, ``credit = saturation / in_flight``; a decision
evicts ``n = ceil((saturation - ceiling - pending) / credit)``, at least 1 and at most
``MAX_REVOCATIONS_PER_DECISION`` (2). An evicted request's credit stays *pending* until its
stream has ended (confirmed) and for a grace after that (the time the saturation signal needs
to show the freed capacity: a few milliseconds for ``concurrency-detector``, which counts
streams itself; scrape interval + staleness + 250 ms for a scraped detector); no new decision
is made while anything is pending, so one blocked request does not evict the whole pool. An
eviction never confirmed within 10 s stops blocking decisions (``timed_out``).

The two policies are plugins; with ``enableEviction`` the evictor uses the configured instance
of each kind, or the built-in one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from epp.flowcontrol.types import DroppedReason, FlowControlQueueFull
from shared.plugins import Plugin

#: Upstream's caps and timings (seconds).
MAX_REVOCATIONS_PER_DECISION = 2
CONFIRMATION_TIMEOUT = 10.0
#: Grace for a detector that sees a stream's end at once (``concurrency-detector``).
LEADING_SENSOR_GRACE = 0.010
#: Engine abort and KV reclaim time, added to the scrape lag for scraped detectors.
ENGINE_RECLAIM_BUDGET = 0.250


class RequestEvicted(FlowControlQueueFull):
    """429 sent to a client whose in-flight request was ended for higher-priority work."""

    code = "flow_control_evicted"

    def __init__(self, retry_after: int = 1) -> None:
        super().__init__("request evicted by flow control for higher-priority requests; "
                         "retry later", retry_after=retry_after, code=self.code,
                         reason=DroppedReason.EVICTED)


@dataclass(slots=True, eq=False)
class InFlightRequest:
    """A request sent to the pool that may be evicted."""

    request_id: str
    priority: int
    #: Event-loop (monotonic) time it was dispatched.
    dispatched_at: float
    #: Ends the request's exchange with the given error (called at most once).
    evict: Callable[[RequestEvicted], None]
    evicted: bool = False


@runtime_checkable
class EvictionFilterPolicy(Protocol):
    """Which in-flight requests may be evicted."""

    type_name: ClassVar[str]

    def evictable(self, priority: int) -> bool: ...


@runtime_checkable
class EvictionOrderingPolicy(Protocol):
    """Which evictable request goes first: the smallest key."""

    type_name: ClassVar[str]

    def eviction_key(self, victim: InFlightRequest) -> tuple[float, float]: ...


class SheddableEvictionFilter(Plugin):
    """Only sheddable requests (priority < 0) may be evicted; priority >= 0 never is."""

    type_name: ClassVar[str] = "sheddable-eviction-filter"

    def evictable(self, priority: int) -> bool:
        return priority < 0


class PriorityThenTimeEvictionOrder(Plugin):
    """key = (priority, -dispatch time): the lowest priority first, and among equals the one
    dispatched last (it has the least KV-cache work to lose)."""

    type_name: ClassVar[str] = "priority-then-time-eviction-order-policy"

    def eviction_key(self, victim: InFlightRequest) -> tuple[float, float]:
        return (float(victim.priority), -victim.dispatched_at)


EVICTION_PLUGINS: tuple[type[Plugin], ...] = (SheddableEvictionFilter,
                                              PriorityThenTimeEvictionOrder)


class RequestEvictor:
    """The evictable requests in flight, and ending them in the ordering policy's order."""

    def __init__(self, filter_policy: EvictionFilterPolicy,
                 ordering: EvictionOrderingPolicy) -> None:
        self.filter = filter_policy
        self.ordering = ordering
        self._inflight: dict[str, InFlightRequest] = {}
        #: All requests in flight (evictable or not), kept by the controller: the
        #: denominator of an eviction's credit.
        self.inflight_total = 0

    def evictable(self, priority: int) -> bool:
        """Would a request of ``priority`` be tracked (and so may be evicted)?"""
        return self.filter.evictable(priority)

    def track(self, victim: InFlightRequest) -> None:
        """``victim`` was dispatched (only called for priorities the filter accepts)."""
        self._inflight[victim.request_id] = victim

    def forget(self, request_id: str) -> InFlightRequest | None:
        """The request's stream ended; returns its entry (``evicted`` says if we ended it)."""
        return self._inflight.pop(request_id, None)

    def stats(self) -> tuple[int, int]:
        """(requests in flight, of which evictable and not already evicted)."""
        live = sum(1 for v in self._inflight.values() if not v.evicted)
        return max(self.inflight_total, live), live

    def peek_victim_priority(self) -> int | None:
        """The priority of the request that would be evicted next (None: nothing is)."""
        victim = self._next()
        return None if victim is None else victim.priority

    def evict_n(self, n: int, priority_bound: int) -> list[str]:
        """End up to ``n`` requests, in order, stopping at the first whose priority is not
        strictly below ``priority_bound`` (the waiting band's); their ids."""
        out: list[str] = []
        while len(out) < n:
            victim = self._next()
            if victim is None or victim.priority >= priority_bound:
                break
            victim.evicted = True
            victim.evict(RequestEvicted())
            out.append(victim.request_id)
        return out

    def _next(self) -> InFlightRequest | None:
        live = [v for v in self._inflight.values() if not v.evicted]
        return min(live, key=self.ordering.eviction_key) if live else None


class EvictionMetrics:
    """llm-d-router v0.10's revocation series."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        p = "llm_d_epp_flow_control_"
        self.issued = Counter(p + "revocations_issued",
                              "In-flight eviction revocations issued, by the waiting band's "
                              "priority.", ["inference_pool", "priority"], registry=registry)
        self.outcomes = Counter(p + "revocations",
                                "In-flight eviction revocations by outcome (confirmed, "
                                "timed_out).", ["inference_pool", "outcome"], registry=registry)
        self.target = Gauge(p + "reclaim_target",
                            "Saturation above the blocked band's ceiling at the last "
                            "reclamation decision.", ["inference_pool"], registry=registry)
        self.confirmation = Histogram(
            p + "revocation_confirmation_seconds",
            "From an eviction to the end of the evicted stream.", ["inference_pool"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry)
        self.pending = Gauge(p + "pending_reclaim",
                             "Pending-reclaim debits of revocations not yet visible in the "
                             "saturation signal (saturation units).", ["inference_pool"],
                             registry=registry)


_default_metrics: EvictionMetrics | None = None


def default_eviction_metrics() -> EvictionMetrics:
    """The process-wide instance on the default registry."""
    global _default_metrics
    if _default_metrics is None:
        _default_metrics = EvictionMetrics()
    return _default_metrics


class Reclamation:
    """Decides when and how many in-flight requests to evict (see the module docstring)."""

    def __init__(self, evictor: RequestEvictor, *, grace: float, pool_name: str = "",
                 metrics: EvictionMetrics | None = None,
                 max_per_decision: int = MAX_REVOCATIONS_PER_DECISION,
                 timeout: float = CONFIRMATION_TIMEOUT) -> None:
        self.evictor = evictor
        self.grace = grace
        self.pool_name = pool_name
        self.metrics = metrics or default_eviction_metrics()
        self.max_per_decision = max_per_decision
        self.timeout = timeout
        #: request id → (credit, issued at): evicted, stream not ended yet.
        self._outstanding: dict[str, tuple[float, float]] = {}
        #: (credit, until): confirmed, the signal may not show it yet.
        self._cooling: list[tuple[float, float]] = []

    @property
    def pending(self) -> float:
        """Saturation the outstanding and cooling evictions will free."""
        return (sum(c for c, _ in self._outstanding.values())
                + sum(c for c, _ in self._cooling))

    def gate_open(self, now: float) -> bool:
        """No eviction is outstanding or cooling (timed-out ones are dropped here)."""
        for rid, (_credit, issued) in list(self._outstanding.items()):
            if now - issued >= self.timeout:
                del self._outstanding[rid]
                self.metrics.outcomes.labels(self.pool_name, "timed_out").inc()
        self._cooling = [(c, until) for c, until in self._cooling if until > now]
        return not self._outstanding and not self._cooling

    def maybe_reclaim(self, now: float, saturation: float,
                      waiting: list[tuple[int, float]]) -> list[str]:
        """``waiting``: (priority, ceiling) of each band, highest first, from the one that
        blocked the dispatch cycle, that has queued requests. Evicts for the first such band
        the pool is saturated for and whose priority is above the next victim's."""
        if not self.gate_open(now):
            return []
        victim = self.evictor.peek_victim_priority()
        if victim is None:
            return []
        for priority, ceiling in waiting:
            if priority <= victim:
                return []
            if ceiling <= 0 or saturation < ceiling:
                continue
            return self._reclaim(now, saturation, ceiling, priority)
        return []

    def confirm(self, request_id: str, now: float) -> None:
        """An evicted request's stream ended: its credit cools for ``grace``."""
        entry = self._outstanding.pop(request_id, None)
        if entry is None:
            return
        self._cooling.append((entry[0], now + self.grace))
        self.metrics.outcomes.labels(self.pool_name, "confirmed").inc()
        self.metrics.confirmation.labels(self.pool_name).observe(now - entry[1])
        self.metrics.pending.labels(self.pool_name).set(self.pending)

    def _reclaim(self, now: float, saturation: float, ceiling: float,
                 priority: int) -> list[str]:
        inflight, evictable = self.evictor.stats()
        if inflight <= 0 or evictable <= 0:
            return []
        credit = saturation / inflight
        if not math.isfinite(credit) or credit <= 0:
            return []
        self.metrics.target.labels(self.pool_name).set(saturation - ceiling)
        net = saturation - ceiling - self.pending
        n = max(1, math.ceil(net / credit)) if net > 0 else 1
        n = min(n, self.max_per_decision, evictable)
        evicted = self.evictor.evict_n(n, priority)
        for rid in evicted:
            self._outstanding[rid] = (credit, now)
        if evicted:
            self.metrics.issued.labels(self.pool_name, str(priority)).inc(len(evicted))
            self.metrics.pending.labels(self.pool_name).set(self.pending)
        return evicted


def eviction_policies(plugins: Mapping[str, object]) -> tuple[EvictionFilterPolicy,
                                                              EvictionOrderingPolicy]:
    """The configured filter and ordering instances (the first of each kind), else the
    built-in ones."""
    found: dict[type[Any], Any] = {}
    for p in plugins.values():
        for kind in (EvictionFilterPolicy, EvictionOrderingPolicy):
            if kind not in found and isinstance(p, kind):
                found[kind] = p
    return (found.get(EvictionFilterPolicy) or SheddableEvictionFilter(),
            found.get(EvictionOrderingPolicy) or PriorityThenTimeEvictionOrder())
