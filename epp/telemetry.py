"""Metrics the EPP exports, under upstream's names so existing dashboards keep working.

Per-request series are updated once per request (cheap label lookups are cached per model
pair); pool gauges are computed by a collector when Prometheus scrapes, never per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.datastore import Datastore

_LATENCY = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10,
            15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
_SIZES = tuple(float(2**i) for i in range(6, 31, 2))
_TOKENS = tuple(float(2**i) for i in range(0, 20))
_NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
_SCHED = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1)

MODEL = ["model_name", "target_model_name"]

REQUESTS = Counter("inference_objective_request_total", "Requests per model.", MODEL)
ERRORS = Counter("inference_objective_request_error_total", "Failed requests per model.",
                 [*MODEL, "error_code"])
DURATION = Histogram("inference_objective_request_duration_seconds",
                     "Request latency from pick to response end.", MODEL, buckets=_LATENCY)
REQUEST_SIZES = Histogram("inference_objective_request_sizes", "Request body bytes.", MODEL,
                          buckets=_SIZES)
RESPONSE_SIZES = Histogram("inference_objective_response_sizes", "Response body bytes.", MODEL,
                           buckets=_SIZES)
INPUT_TOKENS = Histogram("inference_objective_input_tokens", "Prompt tokens (usage).", MODEL,
                         buckets=_TOKENS)
OUTPUT_TOKENS = Histogram("inference_objective_output_tokens", "Completion tokens (usage).",
                          MODEL, buckets=_TOKENS)
RUNNING = Gauge("inference_objective_running_requests", "Requests in flight per model.",
                ["model_name"])
NTPOT = Histogram("inference_objective_normalized_time_per_output_token_seconds",
                  "Request latency divided by output tokens.", MODEL, buckets=_NTPOT)
SCHEDULER_E2E = Histogram("inference_extension_scheduler_e2e_duration_seconds",
                          "Time to pick an endpoint.", buckets=_SCHED)
PLUGIN_DURATION = Histogram("inference_extension_plugin_duration_seconds",
                            "Time spent in one scheduling plugin.",
                            ["extension_point", "plugin_type", "plugin_name"], buckets=_SCHED)
INFO = Gauge("inference_extension_info", "EPP build information.", ["commit", "build_ref"])


class HitRatio:
    """Exponentially weighted mean of per-request prefix hit ratios (the scheduler's hook)."""

    def __init__(self, alpha: float = 0.05) -> None:
        self.alpha = alpha
        self.value = 0.0

    def observe(self, ratio: float) -> None:
        self.value += self.alpha * (ratio - self.value)


class PoolCollector(Collector):
    """Pool gauges computed from the datastore at scrape time."""

    def __init__(self, pool_name: str, datastore: Datastore,
                 prefix_stats: Callable[[], tuple[int, float]] | None = None,
                 staleness: float = 2.0) -> None:
        self.pool_name = pool_name
        self.datastore = datastore
        self.prefix_stats = prefix_stats
        self.staleness = staleness

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.monotonic()
        views = self.datastore.views()
        fresh = [v for v in views if v.healthy and v.age(now) <= self.staleness]
        kv = GaugeMetricFamily("inference_pool_average_kv_cache_utilization",
                               "Mean KV-cache utilization of fresh endpoints.", labels=["name"])
        queue = GaugeMetricFamily("inference_pool_average_queue_size",
                                  "Mean waiting queue of fresh endpoints.", labels=["name"])
        ready = GaugeMetricFamily("inference_pool_ready_pods", "Ready endpoints in the pool.",
                                  labels=["name"])
        per_pod = GaugeMetricFamily("inference_pool_per_pod_queue_size",
                                    "Waiting queue per endpoint.",
                                    labels=["name", "model_server_pod"])
        n = len(fresh)
        kv.add_metric([self.pool_name], sum(v.metrics.kv_usage for v in fresh) / n if n else 0.0)
        queue.add_metric([self.pool_name], sum(v.metrics.waiting for v in fresh) / n if n else 0)
        ready.add_metric([self.pool_name], float(len(self.datastore.candidates())))
        for v in views:
            per_pod.add_metric([self.pool_name, v.endpoint.name], float(v.metrics.waiting))
        yield from (kv, queue, ready, per_pod)
        if self.prefix_stats is not None:
            size, hit_ratio = self.prefix_stats()
            s = GaugeMetricFamily("inference_extension_prefix_indexer_size",
                                  "Entries in the prefix-cache index.")
            s.add_metric([], float(size))
            h = GaugeMetricFamily("inference_extension_prefix_indexer_hit_ratio",
                                  "Matched / total prompt blocks of recent requests.")
            h.add_metric([], hit_ratio)
            yield from (s, h)


def register_pool(collector: PoolCollector) -> None:
    """Register the pool collector with the default registry (once per process)."""
    REGISTRY.register(collector)

# llm-d's name: one count per request scheduled by a P/D profile handler.
DISAGG_DECISIONS = Counter("llm_d_inference_scheduler_disagg_decision_total",
                           "Disaggregation routing decisions (decode-only, prefill-decode).",
                           ["model_name", "decision_type"])
