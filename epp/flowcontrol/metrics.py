"""Flow-control series under upstream v1.5's names, labels and buckets.

| series | type | labels |
|---|---|---|
| ``inference_extension_flow_control_request_queue_duration_seconds`` | histogram | fairness_id, priority, outcome, inference_pool, model_name, target_model_name |
| ``inference_extension_flow_control_dispatch_cycle_duration_seconds`` | histogram | — |
| ``inference_extension_flow_control_request_enqueue_duration_seconds`` | histogram | fairness_id, priority, outcome |
| ``inference_extension_flow_control_queue_size`` | gauge | fairness_id, priority, inference_pool, model_name, target_model_name |
| ``inference_extension_flow_control_queue_bytes`` | gauge | same as queue_size |
| ``inference_extension_flow_control_pool_saturation`` | gauge | inference_pool |

Each is also exported under llm-d-router v0.10's name (``llm_d_epp_flow_control_*``, same
labels and buckets), as upstream exports both; v0.10's
``llm_d_epp_flow_control_requests_total{outcome, priority, inference_pool}`` counts final
outcomes.

v0.10's ``llm_d_epp_flow_control_stale_endpoints{detector}`` (gauge, no legacy twin, as
upstream) is set by the ``utilization-detector`` at every saturation reading: how many of the
candidate endpoints had metrics missing or older than its staleness threshold (each such
endpoint reads as fully saturated), so a pool pinned at saturation 1.0 by a broken scrape can be
told from a busy one.

The fairness id comes from a client header, so a gauge series is removed once its flow is
empty: clients cannot grow the gauges without bound by inventing ids.
"""  # noqa: E501

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

_QUEUE_DURATION = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0, 60.0)
_FAST = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_FLOW = ["fairness_id", "priority", "inference_pool", "model_name", "target_model_name"]

GaugeKey = tuple[str, str, str, str, str]


class FlowControlMetrics:
    """The six flow-control series, registered on ``registry`` (the default one in the EPP)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self._legacy = _Series("inference_extension_flow_control_", registry)
        self._v010 = _Series("llm_d_epp_flow_control_", registry)
        self.requests = Counter("llm_d_epp_flow_control_requests",
                                "Requests that reached a final flow-control outcome.",
                                ["outcome", "priority", "inference_pool"], registry=registry)
        self.queue_duration = _Pair(self._legacy.queue_duration, self._v010.queue_duration)
        self.dispatch_cycle = _Pair(self._legacy.dispatch_cycle, self._v010.dispatch_cycle)
        self.enqueue_duration = _Pair(self._legacy.enqueue_duration,
                                      self._v010.enqueue_duration)
        self.queue_size = _Pair(self._legacy.queue_size, self._v010.queue_size)
        self.queue_bytes = _Pair(self._legacy.queue_bytes, self._v010.queue_bytes)
        self.pool_saturation = _Pair(self._legacy.pool_saturation, self._v010.pool_saturation)
        # Labelled children are looked up once per label set (labels() costs ~10 µs); the
        # caches are bounded because fairness ids come from clients.
        self._held: dict[GaugeKey, tuple[int, Any, Any]] = {}
        self._outcomes: dict[tuple[str, ...], Any] = {}
        self._enqueues: dict[tuple[str, str, str], Any] = {}
        self._saturation: dict[tuple[str, ...], Any] = {}
        self._requests: dict[tuple[str, ...], Any] = {}

    def queued(self, key: GaugeKey, nbytes: int) -> None:
        """One request of ``nbytes`` entered a queue."""
        held = self._held.get(key)
        if held is None:
            held = (0, self.queue_size.labels(*key), self.queue_bytes.labels(*key))
        n, size, nb = held
        self._held[key] = (n + 1, size, nb)
        size.inc()
        nb.inc(nbytes)

    def left(self, key: GaugeKey, nbytes: int) -> None:
        """One request of ``nbytes`` left its queue; the series goes when the flow is empty."""
        held = self._held.get(key)
        if held is None:
            return
        n, size, nb = held
        if n > 1:
            self._held[key] = (n - 1, size, nb)
            size.dec()
            nb.dec(nbytes)
            return
        del self._held[key]
        for g in (self.queue_size, self.queue_bytes):
            g.remove(*key)

    def outcome(self, labels: tuple[str, str, str, str, str, str], waited: float) -> None:
        """A request's final outcome; ``labels`` = (fairness_id, priority, outcome,
        inference_pool, model_name, target_model_name)."""
        _cached(self._outcomes, labels, self.queue_duration).observe(waited)
        _cached(self._requests, (labels[2], labels[1], labels[3]), self.requests).inc()

    def enqueued(self, fairness_id: str, priority: str, outcome: str, seconds: float) -> None:
        """Time taken to queue (or decide without queueing) one request."""
        child = _cached(self._enqueues, (fairness_id, priority, outcome), self.enqueue_duration)
        child.observe(seconds)

    def saturation(self, pool: str, value: float) -> None:
        """The pool saturation flow control last read."""
        _cached(self._saturation, (pool,), self.pool_saturation).set(value)


class _Series:
    """The six series under one name prefix."""

    def __init__(self, p: str, registry: CollectorRegistry) -> None:
        self.queue_duration = Histogram(
            p + "request_queue_duration_seconds",
            "Time requests spend in flow control, from enqueue to final outcome.",
            ["fairness_id", "priority", "outcome", "inference_pool", "model_name",
             "target_model_name"], buckets=_QUEUE_DURATION, registry=registry)
        self.dispatch_cycle = Histogram(
            p + "dispatch_cycle_duration_seconds",
            "Time taken by one dispatch cycle of flow control.", buckets=_FAST,
            registry=registry)
        self.enqueue_duration = Histogram(
            p + "request_enqueue_duration_seconds",
            "Time taken to enqueue a request into flow control.",
            ["fairness_id", "priority", "outcome"], buckets=_FAST, registry=registry)
        self.queue_size = Gauge(p + "queue_size",
                                "Requests currently held in the flow control queues.", _FLOW,
                                registry=registry)
        self.queue_bytes = Gauge(p + "queue_bytes",
                                 "Bytes of the requests currently held in flow control.", _FLOW,
                                 registry=registry)
        self.pool_saturation = Gauge(p + "pool_saturation",
                                     "Saturation of the pool as flow control last read it "
                                     "(0 = idle, 1 = saturated).", ["inference_pool"],
                                     registry=registry)


class _Pair:
    """Two metrics (or children) recorded together: upstream's current and legacy name."""

    __slots__ = ("a", "b")

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b

    def labels(self, *values: str) -> _Pair:
        return _Pair(self.a.labels(*values), self.b.labels(*values))

    def remove(self, *values: str) -> None:
        for m in (self.a, self.b):
            with contextlib.suppress(KeyError):
                m.remove(*values)

    def observe(self, v: float) -> None:
        self.a.observe(v)
        self.b.observe(v)

    def inc(self, v: float = 1) -> None:
        self.a.inc(v)
        self.b.inc(v)

    def dec(self, v: float = 1) -> None:
        self.a.dec(v)
        self.b.dec(v)

    def set(self, v: float) -> None:
        self.a.set(v)
        self.b.set(v)


_CACHE_MAX = 4096


def _cached(cache: dict[Any, Any], key: tuple[str, ...], metric: Any) -> Any:
    child = cache.get(key)
    if child is None:
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        child = cache[key] = metric.labels(*key)
    return child


_stale: Gauge | None = None


def stale_endpoints_gauge() -> Gauge:
    """``llm_d_epp_flow_control_stale_endpoints{detector}`` on the default registry."""
    global _stale
    if _stale is None:
        _stale = Gauge("llm_d_epp_flow_control_stale_endpoints",
                       "Candidate endpoints whose metrics were missing or older than the "
                       "staleness threshold at the last saturation reading.", ["detector"])
    return _stale


_default: FlowControlMetrics | None = None


def default_metrics() -> FlowControlMetrics:
    """The process-wide instance on the default registry (created on first use)."""
    global _default
    if _default is None:
        _default = FlowControlMetrics()
    return _default
