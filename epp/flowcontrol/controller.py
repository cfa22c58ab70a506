"""The flow controller: requests wait here by priority and tenant until the pool has room.

A caller (the flow-control admitter) awaits :meth:`FlowController.enqueue_and_wait` and gets
exactly one :class:`Outcome`:

- **fast path**: nothing waits at its priority or above and the pool is below the band's usage
  limit → ``Dispatched`` at once, without queueing (and without yielding to the event loop,
  so the caller commits its pick before the next request reads saturation);
- **full**: a band's own ``maxBytes``/``maxRequests`` is met → ``RejectedCapacity`` (429);
  a global limit is met → lower-priority requests are displaced, lowest band first, newest
  request of its heaviest flow first (``EvictedDisplaced``, 429) if that frees enough room,
  otherwise the newcomer is rejected (``RejectedCapacity``);
- **queued**: the dispatcher releases it (``Dispatched``) when the saturation callable says
  there is room; or its TTL passes (``EvictedTTL``, 503); or the caller is cancelled — the
  client went away — and it leaves the queue at once (``EvictedContextCancelled``); or the
  controller shuts down (``EvictedOther``, 503; or ``Dispatched`` when it closes with
  ``release``, for a FailOpen pool).

The dispatcher runs one cycle per release: read saturation once, walk bands from the highest
priority, stop at the first band whose usage limit the pool has reached (head-of-line blocking,
as upstream), else let the band's fairness policy choose a flow and release that flow's head.
A released request is *in transit* until its caller resumes (from there to its pick nothing
yields to the event loop); while one is in transit the dispatcher releases nothing more and
the fast path is closed, so saturation is never read without that pick — otherwise a request
arriving in between could take the slot the released one was given, and the released one
would find no endpoint with room. While saturated the dispatcher sleeps until :meth:`notify`
(call it when capacity may have freed: a response ended, metrics were refreshed) or
``poll_interval``.

The saturation callable must be synchronous and cheap, and should count requests the EPP has
sent but the servers' metrics do not show yet (the utilization detector's queue does).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from epp.flowcontrol.config import FlowControlConfig, PriorityBandConfig
from epp.flowcontrol.eviction import (
    LEADING_SENSOR_GRACE,
    InFlightRequest,
    Reclamation,
    RequestEvicted,
    RequestEvictor,
    eviction_policies,
)
from epp.flowcontrol.metrics import FlowControlMetrics, GaugeKey, default_metrics
from epp.flowcontrol.policies import (
    FairnessPolicy,
    OrderingPolicy,
    ServiceAccounting,
    UsageLimitPolicy,
    resolve,
)
from epp.flowcontrol.queues import Band, FlowQueue
from epp.flowcontrol.types import FlowControlRequest, Outcome, QueueItem, TokenUsage, error_for

log = structlog.get_logger(__name__)

SaturationFn = Callable[[], float]

#: How far back dispatches count for the retry-after estimate (seconds).
RATE_WINDOW = 10.0
#: Retry-after bounds (seconds); the longer one is used when nothing was dispatched lately.
MIN_RETRY_AFTER, MAX_RETRY_AFTER, IDLE_RETRY_AFTER = 1, 60, 10


class FlowController:
    """Queues for one pool, and the dispatcher that drains them."""

    def __init__(
        self,
        config: FlowControlConfig,
        saturation: SaturationFn,
        *,
        pool_name: str = "",
        plugins: Mapping[str, object] | None = None,
        metrics: FlowControlMetrics | None = None,
        poll_interval: float = 0.005,
        pool_endpoints: Callable[[], int] | None = None,
        eviction_grace: float = LEADING_SENSOR_GRACE,
    ) -> None:
        """``plugins`` are configured plugin instances by name, for the policy refs; refs to
        built-in types not among them get a default instance (upstream's loader does the same).
        Raises :class:`~epp.flowcontrol.config.FlowControlConfigError` for a bad ref."""
        self.config = config
        self.saturation = saturation
        self._pool_name = pool_name
        #: How many endpoints the pool has (its emptiness turns 429s into 503s, upstream
        #: v0.10); None: never empty.
        self.pool_endpoints = pool_endpoints
        self.poll_interval = poll_interval
        self.metrics = metrics or default_metrics()
        self._plugins: Mapping[str, object] = plugins or {}
        self.usage_limit: UsageLimitPolicy = resolve(
            config.usage_limit_policy_ref, UsageLimitPolicy, self._plugins,
            "flowControl.usageLimitPolicyPluginRef")
        self._bands: dict[int, Band] = {}
        #: Bands, highest priority first.
        self._order: list[Band] = []
        for i, bc in enumerate(config.priority_bands):
            self._add_band(bc, f"flowControl.priorityBands[{i}]")
        # Check the template's refs now, so a dynamically provisioned band cannot fail later.
        self._policies(config.default_priority_band, "flowControl.defaultPriorityBand")
        #: Requests and bytes held in all queues.
        self.length = 0
        self.nbytes = 0
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._dispatched: deque[float] = deque(maxlen=256)
        #: Released requests whose callers have not resumed yet (see the module docstring).
        self.in_transit = 0
        self._settled = asyncio.Event()
        #: In-flight eviction (``enableEviction``), else None.
        self.reclamation: Reclamation | None = None
        if config.enable_eviction:
            self.reclamation = Reclamation(RequestEvictor(*eviction_policies(self._plugins)),
                                           grace=eviction_grace, pool_name=pool_name)

    @property
    def pool_name(self) -> str:
        """The ``inference_pool`` label of the flow-control series (set once the pool is
        known)."""
        return self._pool_name

    @pool_name.setter
    def pool_name(self, name: str) -> None:
        self._pool_name = name
        if self.reclamation is not None:
            self.reclamation.pool_name = name

    # --- the caller's side -------------------------------------------------------------

    async def enqueue_and_wait(self, req: FlowControlRequest) -> Outcome:
        """Hold ``req`` until it may go (``Dispatched``) or must not (any other outcome)."""
        loop = self._loop = asyncio.get_running_loop()
        now = loop.time()
        started = time.perf_counter()
        if self._closed:
            return self._decided(req, Outcome.REJECTED_OTHER, started)
        band = self._band(req.priority)
        if self._may_bypass(band):
            self._dispatched.append(now)
            return self._decided(req, Outcome.DISPATCHED, started)
        empty = self.pool_empty()
        if not self._make_room(band, req.byte_size):
            # With no endpoints the queue is a waiting room for scale-from-zero; a full one
            # means no capacity exists at all (503), not contention (429) - upstream v0.10.
            return self._decided(req, Outcome.REJECTED_NO_ENDPOINTS if empty
                                 else Outcome.REJECTED_CAPACITY, started)
        no_ep_ttl = self.config.no_endpoint_request_ttl
        if empty and no_ep_ttl == 0:
            return self._decided(req, Outcome.REJECTED_NO_ENDPOINTS, started)

        ttl = req.ttl or self.config.default_request_ttl
        item: QueueItem[FlowQueue] = QueueItem(req, now, now + ttl if ttl > 0 else None,
                                               next(self._seq), loop.create_future())
        band.flow(req.fairness_id).push(item)
        self.length += 1
        self.nbytes += req.byte_size
        self.metrics.queued(self._gauge_key(req), req.byte_size)
        self.metrics.enqueued(req.fairness_id, str(req.priority), "NotYetFinalized",
                              time.perf_counter() - started)
        self._ensure_dispatcher()
        self._wake.set()
        try:
            if item.deadline is None:
                await item.future
            else:
                async with asyncio.timeout_at(item.deadline):
                    await item.future
        except TimeoutError:
            self._finalize(item, Outcome.EVICTED_TTL)
        except asyncio.CancelledError:
            self._finalize(item, Outcome.EVICTED_CONTEXT_CANCELLED)
            raise
        finally:
            if item.outcome is None:  # the waiter went away without a cancellation
                self._finalize(item, Outcome.EVICTED_CONTEXT_CANCELLED)
            self._arrived(item)
        assert item.outcome is not None
        return item.outcome

    async def admit(self, req: FlowControlRequest) -> None:
        """:meth:`enqueue_and_wait`, raising the client's error unless dispatched."""
        outcome = await self.enqueue_and_wait(req)
        if outcome is Outcome.DISPATCHED:
            return
        empty = outcome in (Outcome.EVICTED_TTL, Outcome.REJECTED_CAPACITY) and self.pool_empty()
        err = error_for(outcome, self.retry_after(), pool_empty=empty)
        if err is not None:
            raise err

    def uses(self, policy_type: type) -> bool:
        """Does a configured band (or a band template) use a fairness policy of this type?"""
        c = self.config
        templates = [c.default_priority_band, *c.priority_bands]
        if c.default_negative_priority_band is not None:
            templates.append(c.default_negative_priority_band)
        return any(isinstance(self._policies(bc, "flowControl")[1], policy_type)
                   for bc in templates)

    def pool_empty(self) -> bool:
        """True when the pool has no endpoints (what a refusal's status depends on)."""
        if self.pool_endpoints is None:
            return False
        try:
            return self.pool_endpoints() == 0
        except Exception:
            log.warning("counting the pool's endpoints failed", exc_info=True)
            return False

    def notify(self) -> None:
        """Capacity may have freed (a response ended, metrics refreshed): try to dispatch."""
        self._wake.set()

    def started(self, priority: int, fairness_id: str, prompt_tokens: int = 0) -> None:
        """A request of this flow picked its endpoint (fast path or released): it counts in
        flight for its flow until :meth:`ended` (what ``least-inflight-fairness-policy``
        reads); a token-counting fairness policy is charged its estimated prompt."""
        band = self._band(priority)
        band.started(fairness_id)
        if isinstance(band.fairness, ServiceAccounting):
            band.fairness.started(fairness_id, prompt_tokens)

    def ended(self, priority: int, fairness_id: str, usage: TokenUsage | None = None) -> None:
        """A request counted by :meth:`started` ended (response done, error or broken
        stream); capacity may have freed, so the dispatcher wakes. ``usage``: the response's
        exact token counts, for token-counting fairness policies."""
        band = self._bands.get(priority)
        if band is not None:
            band.ended(fairness_id)
            if usage is not None and isinstance(band.fairness, ServiceAccounting):
                band.fairness.served(fairness_id, usage.prompt_tokens, usage.completion_tokens,
                                     usage.cached_tokens, usage.estimated_prompt_tokens)
        self.notify()

    def track_inflight(self, request_id: str, priority: int,
                       evict: Callable[[RequestEvicted], None]) -> bool:
        """With eviction on: a dispatched request of ``priority`` that the eviction filter
        accepts may be ended through ``evict``; True when it is tracked (call
        :meth:`untrack_inflight` when its stream ends)."""
        rec = self.reclamation
        if rec is None or not rec.evictor.evictable(priority):
            return False
        rec.evictor.track(InFlightRequest(request_id, priority, time.monotonic(), evict))
        return True

    def untrack_inflight(self, request_id: str) -> None:
        """A tracked request's stream ended; an evicted one confirms its eviction."""
        rec = self.reclamation
        if rec is None:
            return
        entry = rec.evictor.forget(request_id)
        if entry is not None and entry.evicted:
            rec.confirm(request_id, time.monotonic())
        self.notify()

    def retry_after(self, now: float | None = None) -> int:
        """Seconds a refused client should wait: the queue's length over the recent dispatch
        rate, within [1, 60]; 10 when nothing was dispatched in the last 10 s."""
        if now is None:
            now = self._loop.time() if self._loop is not None else time.monotonic()
        recent = [t for t in self._dispatched if now - t <= RATE_WINDOW]
        if len(recent) < 2 or recent[-1] <= recent[0]:
            return IDLE_RETRY_AFTER if self.length else MIN_RETRY_AFTER
        rate = (len(recent) - 1) / (recent[-1] - recent[0])
        return int(min(MAX_RETRY_AFTER, max(MIN_RETRY_AFTER, math.ceil(self.length / rate))))

    # --- lifecycle ---------------------------------------------------------------------

    async def aclose(self, *, release: bool = False) -> None:
        """Stop dispatching and refuse new requests. Every queued request ends
        ``EvictedOther`` (503), or with ``release`` is let go as ``Dispatched`` without
        waiting for room — what a FailOpen pool wants when its EPP goes away."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for band in self._order:
            for flow in list(band.flows.values()):
                while (item := flow.head()) is not None:
                    self._finalize(item, Outcome.DISPATCHED if release else Outcome.EVICTED_OTHER)

    def snapshot(self) -> dict[str, Any]:
        """The queues as JSON-ready data (for ``/debug/pool``)."""
        return {
            "queued": self.length,
            "bytes": self.nbytes,
            "bands": [
                {
                    "priority": b.priority,
                    "queued": b.length,
                    "bytes": b.nbytes,
                    "maxBytes": b.config.effective_max_bytes,
                    "maxRequests": b.config.effective_max_requests,
                    "fairnessPolicy": b.fairness.type_name,
                    "orderingPolicy": b.ordering.type_name,
                    "flows": {f.fairness_id: {"queued": f.length, "bytes": f.nbytes}
                              for f in b.flows.values()},
                    "inflight": dict(b.inflight),
                }
                for b in self._order
            ],
        }

    # --- dispatch ----------------------------------------------------------------------

    def dispatch_cycle(self) -> bool:
        """Release at most one request; True if one was released."""
        started = time.perf_counter()
        try:
            if self.pool_empty():
                self._expire_without_endpoints()
                return False  # nothing can be served until the pool has endpoints
            sat = self._read_saturation()
            ceilings = self.usage_limit.ceilings(sat, [b.priority for b in self._order])
            for i, (band, ceiling) in enumerate(zip(self._order, ceilings, strict=True)):
                if sat >= ceiling:
                    if self.reclamation is not None:
                        self._maybe_reclaim(sat, ceilings, i)
                    return False  # head-of-line blocking: lower bands wait too
                if band.length == 0:
                    continue
                flow = band.fairness.pick(band)
                item = flow.head() if flow is not None else None
                if item is None:
                    continue
                self._finalize(item, Outcome.DISPATCHED)
                self._dispatched.append(item.future.get_loop().time())
                return True
            return False
        finally:
            self.metrics.dispatch_cycle.observe(time.perf_counter() - started)

    def _maybe_reclaim(self, sat: float, ceilings: Sequence[float], blocked: int) -> None:
        """Dispatch stopped at band ``blocked``: evict in-flight requests of lower priority
        for the highest band from there that has requests waiting."""
        rec = self.reclamation
        assert rec is not None
        waiting = [(b.priority, c) for b, c in zip(self._order[blocked:], ceilings[blocked:],
                                                    strict=True) if b.length]
        if not waiting:
            return
        rec.evictor.inflight_total = sum(sum(b.inflight.values()) for b in self._order)
        rec.maybe_reclaim(time.monotonic(), sat, waiting)

    def _expire_without_endpoints(self) -> None:
        """``noEndpointRequestTTL``: while the pool has no endpoints, a request that has
        waited that long leaves (``EvictedTTL``; its caller answers 503 no-endpoints)."""
        limit = self.config.no_endpoint_request_ttl
        if limit is None or self.length == 0:
            return
        if self._loop is None:
            return
        now = self._loop.time()
        for band in self._order:
            for flow in list(band.flows.values()):
                expired = [i for i in flow.items() if now - i.enqueued_at >= limit]
                for item in expired:
                    self._finalize(item, Outcome.EVICTED_TTL)

    async def _run(self) -> None:
        while True:
            if self.length == 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._wake.clear()
            try:
                released = self.dispatch_cycle()
            except Exception:
                log.exception("flow control dispatch cycle failed")
                released = False
            if released:
                if self.in_transit:  # the released request makes its pick first
                    self._settled.clear()
                    await self._settled.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval):
                    await self._wake.wait()

    def _ensure_dispatcher(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="flow-control-dispatcher")

    # --- internals ---------------------------------------------------------------------

    def _read_saturation(self) -> float:
        try:
            sat = float(self.saturation())
        except Exception:
            log.warning("saturation detector failed; treating the pool as saturated",
                        exc_info=True)
            sat = math.inf
        if math.isnan(sat):
            sat = math.inf
        self.metrics.saturation(self.pool_name, sat)
        return sat

    def _arrived(self, item: QueueItem) -> None:
        """``item``'s caller resumed: it is no longer in transit."""
        if item.in_transit:
            item.in_transit = False
            self.in_transit -= 1
            if self.in_transit == 0:
                self._settled.set()

    def _may_bypass(self, band: Band) -> bool:
        """Fast path: nothing waits at this priority or above, no released request is still
        on its way to its pick, and the pool has room for it."""
        if self.in_transit or self.pool_empty():
            return False  # an empty pool: the queue is a waiting room for scale-from-zero
        for b in self._order:
            if b.priority < band.priority:
                break
            if b.length:
                return False
        sat = self._read_saturation()
        ceilings = self.usage_limit.ceilings(sat, [b.priority for b in self._order])
        for b, ceiling in zip(self._order, ceilings, strict=True):
            if sat >= ceiling:
                return False
            if b is band:
                return True
        return False

    def _make_room(self, band: Band, nbytes: int) -> bool:
        """True if a request of ``nbytes`` fits in ``band``, displacing lower bands if the
        global limits need it and that suffices; False (nothing displaced) otherwise."""
        if not band.fits(nbytes):
            return False
        c = self.config
        need_n = self.length + 1 - c.max_requests if c.max_requests else 0
        need_b = self.nbytes + nbytes - c.max_bytes if c.max_bytes else 0
        if need_n <= 0 and need_b <= 0:
            return True
        lower = [b for b in reversed(self._order) if b.priority < band.priority and b.length]
        if (sum(b.length for b in lower) < need_n
                or sum(b.nbytes for b in lower) < need_b):
            return False
        for b in lower:
            while b.length and (need_n > 0 or need_b > 0):
                heaviest = max(b.flows.values(), key=lambda f: (f.length, f.nbytes))
                victim = heaviest.tail()
                assert victim is not None
                self._finalize(victim, Outcome.EVICTED_DISPLACED)
                need_n -= 1
                need_b -= victim.request.byte_size
        return True

    def _finalize(self, item: QueueItem, outcome: Outcome) -> bool:
        """Give ``item`` its one outcome (False if it already had one) and free its place."""
        if item.outcome is not None:
            return False
        item.outcome = outcome
        req = item.request
        q = item.queue
        if q is not None:
            q.remove(item)
            q.band.drop_if_empty(q)
            self.length -= 1
            self.nbytes -= req.byte_size
            self.metrics.left(self._gauge_key(req), req.byte_size)
        waited = item.future.get_loop().time() - item.enqueued_at
        self.metrics.outcome((req.fairness_id, str(req.priority), outcome.value, self.pool_name,
                              req.model_name, req.target_model_name), max(0.0, waited))
        if not item.future.done():
            if outcome is Outcome.DISPATCHED and q is not None and not self._closed:
                item.in_transit = True
                self.in_transit += 1
            item.future.set_result(outcome)
        return True

    def _decided(self, req: FlowControlRequest, outcome: Outcome, started: float) -> Outcome:
        """Record an outcome decided without queueing (fast path or rejection)."""
        prio = str(req.priority)
        self.metrics.enqueued(req.fairness_id, prio, outcome.value,
                              time.perf_counter() - started)
        self.metrics.outcome((req.fairness_id, prio, outcome.value, self.pool_name,
                              req.model_name, req.target_model_name), 0.0)
        return outcome

    def _gauge_key(self, req: FlowControlRequest) -> GaugeKey:
        return (req.fairness_id, str(req.priority), self.pool_name, req.model_name,
                req.target_model_name)

    def _band(self, priority: int) -> Band:
        band = self._bands.get(priority)
        if band is None:
            band = self._add_band(self.config.band(priority), "flowControl.defaultPriorityBand")
        return band

    def _add_band(self, bc: PriorityBandConfig, where: str) -> Band:
        ordering, fairness = self._policies(bc, where)
        band = Band(bc, ordering, fairness)
        self._bands[bc.priority] = band
        keys = [-b.priority for b in self._order]
        self._order.insert(bisect.bisect(keys, -bc.priority), band)
        return band

    def _policies(self, bc: PriorityBandConfig,
                  where: str) -> tuple[OrderingPolicy, FairnessPolicy]:
        ordering = resolve(bc.ordering_policy_ref, OrderingPolicy, self._plugins,
                           f"{where}.orderingPolicyRef")
        fairness = resolve(bc.fairness_policy_ref, FairnessPolicy, self._plugins,
                           f"{where}.fairnessPolicyRef")
        return ordering, fairness
