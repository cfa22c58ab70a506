"""Metrics the EPP exports, under upstream's names so existing dashboards keep working.

Per-request series are updated once per request (cheap label lookups are cached per model
pair); pool gauges are computed by a collector when Prometheus scrapes, never per request.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import REGISTRY, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from epp.datastore import Datastore

_LATENCY = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10,
            15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
_REQUEST_SIZES = tuple(float(2**i) for i in range(6, 31))  # 64 B .. 1 GiB
# 32778 (not 32768) is upstream's bucket, kept so dashboards' `le` selectors match.
_RESPONSE_SIZES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072,
           262144, 524288, 1048576)
_OUTPUT_TOKENS = _TOKENS[:12]
_NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_SCHED = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1)

_TPOT = (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3,
         0.4, 0.5, 0.6, 0.8, 1, 1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180,
         270, 360)
_TTFT = _LATENCY[:24]  # 5 ms .. 120 s
_STREAMING_TPOT = (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2,
                   0.3, 0.4, 0.5, 0.6, 0.8, 1, 2)
_ITL = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2)
_REQUEST_PROCESSING = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25,
                       0.5, 1, 2.5, 5, 10)
_RESPONSE_PROCESSING = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                        0.25, 0.5, 1, 2.5, 5)
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
                          buckets=_REQUEST_SIZES)
RESPONSE_SIZES = Histogram("inference_objective_response_sizes", "Response body bytes.", MODEL,
                           buckets=_RESPONSE_SIZES)
INPUT_TOKENS = Histogram("inference_objective_input_tokens", "Prompt tokens (usage).", MODEL,
                         buckets=_TOKENS)
OUTPUT_TOKENS = Histogram("inference_objective_output_tokens", "Completion tokens (usage).",
                          MODEL, buckets=_OUTPUT_TOKENS)
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
# llm_d_epp twins of the predicted-latency series: the plugin's identity added.
_PLUGIN_MODEL = ["plugin_name", "plugin_type", *MODEL]
LLMD_REQUEST_METRIC = Gauge("llm_d_epp_inference_request_metric",
                            "Latest TTFT / TPOT (seconds) per model, by type.",
                            [*_PLUGIN_MODEL, "type"])
LLMD_PREDICTED_TTFT = Histogram("llm_d_epp_request_predicted_ttft_seconds",
                                "Predicted TTFT of the picked endpoint.", _PLUGIN_MODEL,
                                buckets=_LATENCY)
LLMD_PREDICTED_TPOT = Histogram("llm_d_epp_request_predicted_tpot_seconds",
                                "Predicted TPOT of the picked endpoint.", _PLUGIN_MODEL,
                                buckets=_TPOT)
LLMD_TTFT_PREDICTION_DURATION = Histogram(
    "llm_d_epp_request_ttft_prediction_duration_seconds",
    "Time to predict TTFT for every candidate of one request.", _PLUGIN_MODEL,
    buckets=_PREDICTION)
LLMD_TPOT_PREDICTION_DURATION = Histogram(
    "llm_d_epp_request_tpot_prediction_duration_seconds",
    "Time to predict TPOT for every candidate of one request.", _PLUGIN_MODEL,
    buckets=_PREDICTION)
LLMD_SLO_VIOLATIONS = Counter("llm_d_epp_request_slo_violation_total",
                              "Requests that missed their SLO, by type (ttft, tpot).",
                              [*_PLUGIN_MODEL, "type"])
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

# -- llm-d-router v0.10's names (llm_d_epp_*) ---------------------------------------------
# Upstream writes each deprecated series above and its llm_d_epp twin below from one record
# call (dual emission, no gate): both dashboards keep working. The twins add `fairness_id` and
# `priority` to the per-request labels.

LLMD_MODEL = [*MODEL, "fairness_id", "priority"]

LLMD_REQUESTS = Counter("llm_d_epp_request_total", "Requests per model, fairness id, priority.",
                        LLMD_MODEL)
LLMD_ERRORS = Counter("llm_d_epp_request_error_total", "Failed requests per model.",
                      [*LLMD_MODEL, "error_code"])
LLMD_DURATION = Histogram("llm_d_epp_request_duration_seconds",
                          "Request latency from pick to response end.", LLMD_MODEL,
                          buckets=_LATENCY)
LLMD_REQUEST_SIZES = Histogram("llm_d_epp_request_size_bytes", "Request body bytes.",
                               LLMD_MODEL, buckets=_REQUEST_SIZES)
LLMD_RESPONSE_SIZES = Histogram("llm_d_epp_response_size_bytes", "Response body bytes.",
                                LLMD_MODEL, buckets=_RESPONSE_SIZES)
LLMD_INPUT_TOKENS = Histogram("llm_d_epp_request_input_tokens", "Prompt tokens (usage).",
                              LLMD_MODEL, buckets=_TOKENS)
LLMD_OUTPUT_TOKENS = Histogram("llm_d_epp_request_output_tokens", "Completion tokens (usage).",
                               LLMD_MODEL, buckets=_OUTPUT_TOKENS)
LLMD_CACHED_TOKENS = Histogram("llm_d_epp_request_cached_tokens",
                               "Prompt tokens served from the server's cache (usage).",
                               LLMD_MODEL, buckets=_TOKENS)
LLMD_RUNNING = Gauge("llm_d_epp_request_running", "Requests in flight.", LLMD_MODEL)
LLMD_NTPOT = Histogram("llm_d_epp_request_ntpot_seconds",
                       "Request latency divided by output tokens.", LLMD_MODEL, buckets=_NTPOT)
LLMD_TTFT = Histogram("llm_d_epp_request_ttft_seconds",
                      "Time from the pick to the first token, by streaming.",
                      [*LLMD_MODEL, "streaming"], buckets=_TTFT)
LLMD_STREAMING_TPOT = Histogram("llm_d_epp_request_streaming_tpot_seconds",
                                "Time per output token after the first (streamed responses).",
                                LLMD_MODEL, buckets=_STREAMING_TPOT)
class CountingHistogram(Collector):
    """A labelled histogram for per-chunk observations: ``observe`` is a bisect and two
    additions (no lock: the EPP records from its one event loop), about a fifth of
    prometheus_client's; the exposition (buckets, ``_sum``, ``_count``) is the same."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float]) -> None:
        self.name, self.documentation = name, documentation
        self._labelnames = tuple(labelnames)
        self._upper_bounds = [float(b) for b in buckets] + [math.inf]
        self._children: dict[tuple[str, ...], CountingHistogram.Child] = {}
        REGISTRY.register(self)

    class Child:
        """One label set's buckets."""

        __slots__ = ("bounds", "counts", "sum")

        def __init__(self, bounds: list[float]) -> None:
            self.bounds, self.counts, self.sum = bounds, [0] * len(bounds), 0.0

        def observe(self, value: float) -> None:
            self.counts[bisect.bisect_left(self.bounds, value)] += 1
            self.sum += value

    def labels(self, *values: str) -> CountingHistogram.Child:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = CountingHistogram.Child(self._upper_bounds)
        return child

    def collect(self) -> Iterator[HistogramMetricFamily]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self._labelnames)
        for values, child in list(self._children.items()):
            total, buckets = 0, []
            for bound, n in zip(self._upper_bounds, child.counts, strict=True):
                total += n
                buckets.append(("+Inf" if bound == math.inf else floatToGoString(bound), total))
            fam.add_metric(list(values), buckets, child.sum)
        yield fam


LLMD_ITL = CountingHistogram(
    "llm_d_epp_request_streaming_itl_seconds",
    "Time between consecutive response body chunks (streamed responses).", LLMD_MODEL, _ITL)
LLMD_SCHEDULER_E2E = Histogram("llm_d_epp_scheduler_e2e_duration_seconds",
                               "Time to pick an endpoint.", buckets=_SCHED)
LLMD_SCHEDULER_ATTEMPTS = Counter(
    "llm_d_epp_scheduler_attempts_total", "Scheduling attempts by outcome and endpoint picked.",
    ["status", "target_model_name", "endpoint_name", "namespace", "port"])
LLMD_PLUGIN_DURATION = Histogram("llm_d_epp_plugin_duration_seconds",
                                 "Time spent in one plugin.",
                                 ["extension_point", "plugin_type", "plugin_name"],
                                 buckets=_SCHED)
REQUEST_PROCESSING = Histogram(
    "llm_d_epp_request_processing_duration_seconds",
    "EPP time from the request's arrival until it is answered (admission wait included).",
    buckets=_REQUEST_PROCESSING)
RESPONSE_PROCESSING = Histogram(
    "llm_d_epp_response_processing_duration_seconds",
    "EPP time handling one response: the sum of per-chunk work when streamed, headers to end "
    "otherwise.", buckets=_RESPONSE_PROCESSING)
LLMD_INFO = Gauge("llm_d_epp_info", "EPP build information.", ["commit", "build_ref"])
LLMD_REWRITE_DECISIONS = Counter("llm_d_epp_model_rewrite_decisions_total",
                                 "Models rewritten by an InferenceModelRewrite.",
                                 ["model_rewrite_name", "model_name", "target_model"])
_PREFIX_LABELS = ["plugin_name", "plugin_type"]
LLMD_PREFIX_HIT_RATIO = Histogram("llm_d_epp_prefix_indexer_hit_ratio",
                                  "Matched / total prompt of each prefix-cache lookup.",
                                  _PREFIX_LABELS, buckets=_HIT_RATIO)
LLMD_PREFIX_HIT_BYTES = Histogram("llm_d_epp_prefix_indexer_hit_bytes",
                                  "Prompt bytes matched by each prefix-cache lookup.",
                                  _PREFIX_LABELS, buckets=_HIT_BYTES)


class BoundedLabel:
    """Label values chosen by clients, capped: the first ``limit`` distinct values are kept,
    later ones read ``other`` (for the life of the process, as upstream). Pinned values (model
    names an InferenceModelRewrite configures) never fold; the empty string passes as is."""

    OVERFLOW = "other"

    def __init__(self, limit: int = 1000) -> None:
        self.limit = limit
        self.seen: set[str] = set()
        self.pinned: set[str] = set()

    def bound(self, value: str) -> str:
        """``value``, or ``other`` once the cap is reached."""
        if not value or value in self.seen or value in self.pinned:
            return value
        if len(self.seen) >= self.limit:
            return self.OVERFLOW
        self.seen.add(value)
        return value

    def pin(self, *values: str) -> None:
        """Never fold these."""
        self.pinned.update(v for v in values if v)


#: ``model_name`` and ``target_model_name`` share one cap; ``fairness_id`` has its own.
MODEL_NAMES = BoundedLabel(1000)
FAIRNESS_IDS = BoundedLabel(1000)


#: Upstream v0.10's fairness header, then its deprecated GIE name.
FAIRNESS_HEADERS = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
DEFAULT_FAIRNESS_ID = "default-flow"


def fairness_id(headers: Mapping[str, str]) -> str:
    """The request's fairness id as upstream's metrics label it (``default-flow`` without)."""
    for h in FAIRNESS_HEADERS:
        if value := headers.get(h):
            return value
    return DEFAULT_FAIRNESS_ID


def bounded(client: str, target: str, fairness_id: str) -> tuple[str, str, str]:
    """The label values recorded for one request (see :class:`BoundedLabel`)."""
    return MODEL_NAMES.bound(client), MODEL_NAMES.bound(target), FAIRNESS_IDS.bound(fairness_id)


class Both:
    """One record call writing a deprecated series and its llm_d_epp twin."""

    __slots__ = ("current", "legacy")

    def __init__(self, legacy: Any, current: Any) -> None:
        self.legacy, self.current = legacy, current

    def observe(self, value: float) -> None:
        self.legacy.observe(value)
        self.current.observe(value)

    def inc(self, value: float = 1) -> None:
        self.legacy.inc(value)
        self.current.inc(value)

    def dec(self, value: float = 1) -> None:
        self.legacy.dec(value)
        self.current.dec(value)


def request_error(model: str, target: str, fairness: str, priority: str, code: str) -> None:
    """A request that failed (refused, server error or broken stream), under both names."""
    model, target, fairness = bounded(model, target, fairness)
    ERRORS.labels(model, target, code).inc()
    LLMD_ERRORS.labels(model, target, fairness, priority, code).inc()


def rewrite_decision(rewrite_name: str, model: str, target: str) -> None:
    """An InferenceModelRewrite rewrote ``model``: counted, and both names pinned so the
    label cap never folds them (upstream pins the rewrite's model names)."""
    MODEL_NAMES.pin(model, target)
    REWRITE_DECISIONS.labels(rewrite_name, model, target).inc()
    LLMD_REWRITE_DECISIONS.labels(rewrite_name, model, target).inc()


def scheduler_e2e(seconds: float) -> None:
    """One scheduling cycle's time."""
    SCHEDULER_E2E.observe(seconds)
    LLMD_SCHEDULER_E2E.observe(seconds)


def plugin_duration(point: str, kind: str, name: str, seconds: float) -> None:
    """One plugin call's time."""
    PLUGIN_DURATION.labels(point, kind, name).observe(seconds)
    LLMD_PLUGIN_DURATION.labels(point, kind, name).observe(seconds)


def prefix_hit_ratio(kind: str, name: str, ratio: float) -> None:
    """One prefix-cache lookup's matched share, of plugin ``kind``/``name``."""
    PREFIX_HIT_RATIO.observe(ratio)
    LLMD_PREFIX_HIT_RATIO.labels(name, kind).observe(ratio)


def prefix_hit_bytes(kind: str, name: str, n: int) -> None:
    """One prefix-cache lookup's matched prompt bytes, of plugin ``kind``/``name``."""
    PREFIX_HIT_BYTES.observe(n)
    LLMD_PREFIX_HIT_BYTES.labels(name, kind).observe(n)


def build_info(commit: str, build_ref: str) -> None:
    """The build-information gauges (always 1)."""
    INFO.labels(commit=commit, build_ref=build_ref).set(1)
    LLMD_INFO.labels(commit=commit, build_ref=build_ref).set(1)


_ATTEMPTS: dict[tuple[str, str, str], Any] = {}


def scheduler_attempt(target_model: str, endpoint: Any | None) -> None:
    """One scheduling cycle: ``endpoint`` (an :class:`~epp.datastore.EndpointView`) picked,
    or None when it found nothing. Series are looked up once per (model, endpoint)."""
    key = (target_model, endpoint.key, endpoint.endpoint.pod_name) if endpoint is not None \
        else (target_model, "", "")
    series = _ATTEMPTS.get(key)
    if series is None:
        if endpoint is None:
            values: tuple[str, ...] = ("failure", target_model, "", "", "")
        else:
            e = endpoint.endpoint
            values = ("success", target_model, e.pod_name, e.namespace, str(e.port))
        series = Both(SCHEDULER_ATTEMPTS.labels(*values), LLMD_SCHEDULER_ATTEMPTS.labels(*values))
        if len(_ATTEMPTS) < 4096:
            _ATTEMPTS[key] = series
    series.inc()


class PoolCollector(Collector):
    """Pool gauges computed from the datastore at scrape time, under both names: the
    deprecated ``inference_pool_*`` and v0.10's ``llm_d_epp_*`` (which adds the standard
    deviations: sample deviation, n - 1, rounded to 2 decimals as upstream)."""

    def __init__(self, pool_name: str, datastore: Datastore,
                 prefix_stats: Callable[[], int] | None = None,
                 staleness: float = 2.0,
                 prefix_sizes: Callable[[], Iterable[tuple[str, str, int]]] | None = None,
                 ) -> None:
        self.pool_name = pool_name
        self.datastore = datastore
        self.prefix_stats = prefix_stats
        self.prefix_sizes = prefix_sizes
        self.staleness = staleness

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.monotonic()
        views = self.datastore.views()
        fresh = [v for v in views if v.healthy and v.age(now) <= self.staleness]
        pool = [self.pool_name]
        columns = (("kv_cache_utilization", [v.metrics.kv_usage for v in fresh]),
                   ("queue_size", [float(v.metrics.waiting) for v in fresh]),
                   ("running_requests", [float(v.metrics.running) for v in fresh]))
        for what, values in columns:
            mean = sum(values) / len(values) if values else 0.0
            for prefix in ("inference_pool_", "llm_d_epp_"):
                g = GaugeMetricFamily(f"{prefix}average_{what}",
                                      f"Mean {what} of endpoints with fresh metrics.",
                                      labels=["name"])
                g.add_metric(pool, mean)
                yield g
            g = GaugeMetricFamily(f"llm_d_epp_std_dev_{what}",
                                  f"Standard deviation of {what} across fresh endpoints.",
                                  labels=["name"])
            g.add_metric(pool, std_dev(values, mean))
            yield g
        ready = float(len(self.datastore.candidates()))
        for name in ("inference_pool_ready_pods", "llm_d_epp_ready_endpoints"):
            g = GaugeMetricFamily(name, "Ready endpoints in the pool.", labels=["name"])
            g.add_metric(pool, ready)
            yield g
        for name, label in (("inference_pool_per_pod_queue_size", "model_server_pod"),
                            ("llm_d_epp_per_endpoint_queue_size", "model_server_endpoint")):
            g = GaugeMetricFamily(name, "Waiting queue per endpoint.", labels=["name", label])
            for v in views:
                g.add_metric([self.pool_name, v.endpoint.name], float(v.metrics.waiting))
            yield g
        if self.prefix_stats is not None:
            s = GaugeMetricFamily("inference_extension_prefix_indexer_size",
                                  "Entries in the prefix-cache index.")
            s.add_metric([], float(self.prefix_stats()))
            yield s
        if self.prefix_sizes is not None:
            s = GaugeMetricFamily("llm_d_epp_prefix_indexer_size",
                                  "Entries in each prefix-cache plugin's index.",
                                  labels=["plugin_name", "plugin_type"])
            for kind, name, size in self.prefix_sizes():
                s.add_metric([name, kind], float(size))
            yield s


def std_dev(values: Sequence[float], mean: float) -> float:
    """Sample standard deviation (n - 1, at least 1), rounded to 2 decimals (upstream's)."""
    if not values:
        return 0.0
    return round(math.sqrt(sum((x - mean) ** 2 for x in values) / max(1, len(values) - 1)), 2)


def register_pool(collector: PoolCollector) -> None:
    """Register the pool collector with the default registry (once per process)."""
    REGISTRY.register(collector)

# llm-d's names: one count per request scheduled by a P/D profile handler (the deprecated
# llm_d_inference_scheduler_* and its llm_d_epp twin with the handler's identity).
DISAGG_DECISIONS = Counter("llm_d_inference_scheduler_disagg_decision_total",
                           "Disaggregation routing decisions (decode-only, prefill-decode).",
                           ["model_name", "decision_type"])
LLMD_DISAGG_DECISIONS = Counter("llm_d_epp_disagg_decision_total",
                                "Disaggregation routing decisions (decode-only, prefill-decode).",
                                ["plugin_name", "plugin_type", "model_name", "decision_type"])
PD_DECISIONS = Counter("llm_d_inference_scheduler_pd_decision_total",
                       "P/D decisions of the deprecated pd-profile-handler.",
                       ["model_name", "decision_type"])
LLMD_PD_DECISIONS = Counter("llm_d_epp_pd_decision_total",
                            "P/D decisions of the deprecated pd-profile-handler.",
                            ["plugin_name", "plugin_type", "model_name", "decision_type"])


def disagg_decision(kind: str, name: str, model: str, decision: str) -> None:
    """One request's disaggregation decision by profile handler ``kind``/``name``: the
    deprecated ``pd-profile-handler`` counts in ``pd_decision_total``, the others in
    ``disagg_decision_total`` (as upstream)."""
    model = model or "unknown"
    if kind == "pd-profile-handler":
        PD_DECISIONS.labels(model, decision).inc()
        LLMD_PD_DECISIONS.labels(name, kind, model, decision).inc()
    else:
        DISAGG_DECISIONS.labels(model, decision).inc()
        LLMD_DISAGG_DECISIONS.labels(name, kind, model, decision).inc()

# llm-d-router v0.10's mm-embeddings-cache-producer: how often the encoder-cache affinity
# LRU finds a request's multimodal items.
ENCODER_CACHE_QUERIES = Counter(
    "llm_d_epp_encoder_cache_queries_total",
    "Multimodal item hash lookups against the encoder-cache affinity LRU.",
    ["plugin_type", "plugin_name", "modality"])
ENCODER_CACHE_HITS = Counter(
    "llm_d_epp_encoder_cache_hits_total",
    "Multimodal item hash lookups that matched an endpoint's encoder-cache affinity LRU.",
    ["plugin_type", "plugin_name", "pod", "modality"])
ENCODER_CACHE_HIT_RATIO = Histogram(
    "llm_d_epp_encoder_cache_hit_ratio",
    "Per endpoint and request: matched multimodal items / the request's items.",
    ["plugin_type", "plugin_name"], buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0))
