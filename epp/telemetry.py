"""Metrics the EPP exports, under upstream's names so existing dashboards keep working.

Per-request series are updated once per request (cheap label lookups are cached per model
pair); pool gauges are computed by a collector when Prometheus scrapes, never per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

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

_TPOT = (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3,
         0.4, 0.5, 0.6, 0.8, 1, 1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 120, 180, 240,
         300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
_PREDICTION = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
               5.0)
_HIT_RATIO = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_HIT_BYTES = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)

MODEL = ["model_name", "target_model_name"]

REQUESTS = Counter("inference_objective_request_total", "Requests per model and priority.",
                   [*MODEL, "priority"])
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
TTFT = Histogram("inference_objective_request_ttft_seconds",
                 "Time from the pick to the first streamed token.", MODEL, buckets=_LATENCY)
TPOT = Histogram("inference_objective_request_tpot_seconds",
                 "Time per output token after the first.", MODEL, buckets=_TPOT)
REQUEST_METRIC = Gauge("inference_objective_inference_request_metric",
                       "Latest TTFT / TPOT (seconds) per model, by type.", [*MODEL, "type"])
CACHED_TOKENS = Histogram("inference_objective_prompt_cached_tokens",
                          "Prompt tokens the server found in its cache (usage).", MODEL,
                          buckets=_TOKENS)
NTPOT = Histogram("inference_objective_normalized_time_per_output_token_seconds",
                  "Request latency divided by output tokens.", MODEL, buckets=_NTPOT)
# Predicted latency (issue #17): what the latency model said for the endpoint that was picked.
PREDICTED_TTFT = Histogram("inference_objective_request_predicted_ttft_seconds",
                           "Predicted TTFT of the picked endpoint.", MODEL, buckets=_LATENCY)
PREDICTED_TPOT = Histogram("inference_objective_request_predicted_tpot_seconds",
                           "Predicted TPOT of the picked endpoint.", MODEL, buckets=_TPOT)
TTFT_PREDICTION_DURATION = Histogram(
    "inference_objective_request_ttft_prediction_duration_seconds",
    "Time to predict TTFT for every candidate of one request.", MODEL, buckets=_PREDICTION)
TPOT_PREDICTION_DURATION = Histogram(
    "inference_objective_request_tpot_prediction_duration_seconds",
    "Time to predict TPOT for every candidate of one request.", MODEL, buckets=_PREDICTION)
SLO_VIOLATIONS = Counter("inference_objective_request_slo_violation_total",
                         "Requests that missed their SLO, by type (ttft, tpot).",
                         [*MODEL, "type"])
SCHEDULER_E2E = Histogram("inference_extension_scheduler_e2e_duration_seconds",
                          "Time to pick an endpoint.", buckets=_SCHED)
SCHEDULER_ATTEMPTS = Counter("inference_extension_scheduler_attempts_total",
                             "Scheduling attempts by outcome and the endpoint picked.",
                             ["status", "target_model_name", "pod_name", "namespace", "port"])
REWRITE_DECISIONS = Counter("inference_extension_model_rewrite_decisions_total",
                            "Models rewritten by an InferenceModelRewrite.",
                            ["model_rewrite_name", "model_name", "target_model"])
PREFIX_HIT_RATIO = Histogram("inference_extension_prefix_indexer_hit_ratio",
                             "Matched / total prompt of each prefix-cache lookup.",
                             buckets=_HIT_RATIO)
PREFIX_HIT_BYTES = Histogram("inference_extension_prefix_indexer_hit_bytes",
                             "Prompt bytes matched by each prefix-cache lookup (blocks x "
                             "characters per block).", buckets=_HIT_BYTES)
PLUGIN_DURATION = Histogram("inference_extension_plugin_duration_seconds",
                            "Time spent in one scheduling plugin.",
                            ["extension_point", "plugin_type", "plugin_name"], buckets=_SCHED)
INFO = Gauge("inference_extension_info", "EPP build information.", ["commit", "build_ref"])


_ATTEMPTS: dict[tuple[str, str, str], Any] = {}


def scheduler_attempt(target_model: str, endpoint: Any | None) -> None:
    """One scheduling cycle: ``endpoint`` (an :class:`~epp.datastore.EndpointView`) picked,
    or None when it found nothing. Series are looked up once per (model, endpoint)."""
    key = (target_model, endpoint.key, endpoint.endpoint.pod_name) if endpoint is not None \
        else (target_model, "", "")
    series = _ATTEMPTS.get(key)
    if series is None:
        if endpoint is None:
            series = SCHEDULER_ATTEMPTS.labels("failure", target_model, "", "", "")
        else:
            e = endpoint.endpoint
            series = SCHEDULER_ATTEMPTS.labels("success", target_model, e.pod_name,
                                               e.namespace, str(e.port))
        if len(_ATTEMPTS) < 4096:
            _ATTEMPTS[key] = series
    series.inc()


class PoolCollector(Collector):
    """Pool gauges computed from the datastore at scrape time."""

    def __init__(self, pool_name: str, datastore: Datastore,
                 prefix_stats: Callable[[], int] | None = None,
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
        running = GaugeMetricFamily("inference_pool_average_running_requests",
                                    "Mean running requests of fresh endpoints.",
                                    labels=["name"])
        ready = GaugeMetricFamily("inference_pool_ready_pods", "Ready endpoints in the pool.",
                                  labels=["name"])
        per_pod = GaugeMetricFamily("inference_pool_per_pod_queue_size",
                                    "Waiting queue per endpoint.",
                                    labels=["name", "model_server_pod"])
        n = len(fresh)
        kv.add_metric([self.pool_name], sum(v.metrics.kv_usage for v in fresh) / n if n else 0.0)
        queue.add_metric([self.pool_name], sum(v.metrics.waiting for v in fresh) / n if n else 0)
        running.add_metric([self.pool_name],
                           sum(v.metrics.running for v in fresh) / n if n else 0)
        ready.add_metric([self.pool_name], float(len(self.datastore.candidates())))
        for v in views:
            per_pod.add_metric([self.pool_name, v.endpoint.name], float(v.metrics.waiting))
        yield from (kv, queue, running, ready, per_pod)
        if self.prefix_stats is not None:
            s = GaugeMetricFamily("inference_extension_prefix_indexer_size",
                                  "Entries in the prefix-cache index.")
            s.add_metric([], float(self.prefix_stats()))
            yield s


def register_pool(collector: PoolCollector) -> None:
    """Register the pool collector with the default registry (once per process)."""
    REGISTRY.register(collector)

# llm-d's name: one count per request scheduled by a P/D profile handler.
DISAGG_DECISIONS = Counter("llm_d_inference_scheduler_disagg_decision_total",
                           "Disaggregation routing decisions (decode-only, prefill-decode).",
                           ["model_name", "decision_type"])
