"""``predicted-latency-producer`` (upstream v1.5): the request's SLO from its headers, a
TTFT/TPOT prediction (central and p90) for every candidate before scheduling, and the
training data after the response. Also records the predicted series and SLO violations
(``epp.telemetry``).

Upstream trains in a sidecar; here the model lives in process (:mod:`epp.latency.predictor`),
retrained in a background thread, served as a dot product.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from epp import telemetry as m
from epp.datastore import EndpointView
from epp.latency.predictions import PREDICTIONS_KEY, Prediction, RequestPredictions
from epp.latency.predictor import EndpointState, LatencyPredictor, PredictorConfig
from epp.latency.slo import parse_slo
from epp.requestcontrol.counts import take
from epp.requestcontrol.plugin import (
    DataProducer,
    PreRequest,
    Response,
    ResponseComplete,
    ResponseStreaming,
)
from epp.scheduling.plugin import EndpointsRemoved, Plugin
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from shared.plugins import Duration, Handle

#: Weight of the newest TPOT in an endpoint's recent average (about its last 20 requests:
#: long enough to say how fast the endpoint is rather than how loaded it was a moment ago).
RECENT_WEIGHT = 0.05


@dataclass(frozen=True, slots=True)
class PredictedLatencyParameters:
    """Upstream's ``sloBufferFactor`` (> 0; the SLO the headroom is measured against is
    SLO * factor), ``streamingMode`` (false: train TTFT on the whole duration and no TPOT;
    true: TTFT to the first streamed token and TPOT of streamed responses),
    ``predictInPrepareData`` (false: collect training data only),
    ``maxDecodeTokenSamplesForPrediction`` (0: the predicted TPOT reported is the pick's; N:
    also predict again, from the endpoint's state then, at up to N streamed tokens spaced
    by a Poisson draw of mean ``samplingMean``, and report the mean of all; streaming mode
    only). Ours, for the in-process model: ``retrainInterval``, ``maxTrainingSamples``,
    ``minTrainingSamples``; ``objectiveType`` (``quantile``, the default: the headrooms the
    SLO-aware plugins read are measured against the ``quantile`` prediction; ``mean``:
    against the central one) and ``quantile`` (in (0, 1), default 0.9) - upstream sets both
    on its predictor sidecars (``LATENCY_OBJECTIVE_TYPE``, quantile 0.9 by default), here
    they are the plugin's. llm-d-router v0.10: ``predictInProduce`` is the new name of
    ``predictInPrepareData``; ``contextTTL`` is accepted and has nothing to bound here (the
    per-request context lives on the request and ends with it, upstream keeps it in a
    cache); ``endpointRoleLabel`` and the multimodal ``useEncoderCacheFeatures`` /
    ``encoderCacheMatchInfoProducerName`` are refused when set (not built)."""

    ALIASES: ClassVar[dict[str, str]] = {"predictInProduce": "predict_in_prepare_data",
                                         "contextTTL": "context_ttl"}

    slo_buffer_factor: float = 1.0
    streaming_mode: bool = False
    predict_in_prepare_data: bool = True
    sampling_mean: float = 1000.0
    max_decode_token_samples_for_prediction: int = 0
    retrain_interval: Duration = Duration(1.0)  # noqa: RUF009 (immutable)
    max_training_samples: int = 5000
    min_training_samples: int = 20
    context_ttl: Duration = Duration(300.0)  # noqa: RUF009 (immutable)
    endpoint_role_label: str = ""
    use_encoder_cache_features: bool = False
    encoder_cache_match_info_producer_name: str = ""
    objective_type: str = "quantile"
    quantile: float = 0.9

    def __post_init__(self) -> None:
        if self.objective_type not in ("quantile", "mean"):
            raise ValueError("objectiveType: must be 'quantile' or 'mean', got "
                             f"{self.objective_type!r}")
        if isinstance(self.quantile, bool) or not 0 < self.quantile < 1:
            raise ValueError(f"quantile: must be in (0, 1), got {self.quantile!r}")
        if self.endpoint_role_label:
            raise ValueError("endpointRoleLabel: role-aware latency features are not built "
                             "yet; remove it")
        if self.use_encoder_cache_features or self.encoder_cache_match_info_producer_name:
            raise ValueError("useEncoderCacheFeatures / encoderCacheMatchInfoProducerName: "
                             "multimodal encoder-cache features are not built (multimodal is "
                             "its own issue)")
        if not self.slo_buffer_factor > 0:
            raise ValueError(f"sloBufferFactor: must be > 0, got {self.slo_buffer_factor!r}")
        if not self.sampling_mean > 0:
            raise ValueError(f"samplingMean: must be > 0, got {self.sampling_mean!r}")
        if self.max_decode_token_samples_for_prediction < 0:
            raise ValueError("maxDecodeTokenSamplesForPrediction: must be >= 0")
        if not self.retrain_interval > 0:
            raise ValueError(f"retrainInterval: must be > 0, got {self.retrain_interval!r}")
        if self.max_training_samples < 1:
            raise ValueError("maxTrainingSamples: must be >= 1")
        if not 1 <= self.min_training_samples <= self.max_training_samples:
            raise ValueError("minTrainingSamples: must be in [1, maxTrainingSamples]")


class PredictedLatencyProducer(Plugin, DataProducer, PreRequest, ResponseStreaming,
                               ResponseComplete, EndpointsRemoved):
    """Before scheduling: SLO = (``x-slo-ttft-ms``, ``x-slo-tpot-ms``) (400 when bad); per
    candidate, TTFT/TPOT predicted from its state and headroom = SLO * factor - predicted.
    After the response: the dispatch-time state and the measured TTFT/TPOT become a training
    sample; a measured value over its SLO counts a violation."""

    type_name = "predicted-latency-producer"
    parameters_type = PredictedLatencyParameters
    params: PredictedLatencyParameters

    def __init__(self, name: str = "", params: Any = None,
                 predictor: LatencyPredictor | None = None, handle: Handle | None = None,
                 ) -> None:
        super().__init__(name, params)
        p = self.params
        self.predictor = predictor or LatencyPredictor(PredictorConfig(
            retrain_interval=p.retrain_interval, max_samples=p.max_training_samples,
            min_samples=p.min_training_samples, quantile=p.quantile))
        self._handle = handle
        self._prefix: list[ApproxPrefixCacheProducer] | None = None  # looked up once
        #: Per endpoint key: prompt tokens dispatched there with no first token back yet.
        self._prefilling: dict[str, int] = {}
        #: Per endpoint key: requests dispatched there with no first token back yet.
        self._prefill_requests: dict[str, int] = {}
        #: Per endpoint key: exponential average of measured TPOTs.
        self._recent_tpot: dict[str, float] = {}
        self._pool_mean: float | None = None  # of ``_recent_tpot`` (None: recompute)
        #: Mean tokens in flight over the candidates of the latest pick (the in-stream
        #: samples' reference for ``relative_inflight``).
        self._mean_inflight = 0.0

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> PredictedLatencyProducer:
        plugin = cls(name, params, handle=handle)
        # Fits run in one spawned worker process (no GIL shared with the request path;
        # spawn, not fork: the EPP runs gRPC threads). It starts at the first fit.
        plugin.predictor.executor = ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        plugin.predictor.start()
        return plugin

    def _prefix_producer(self) -> ApproxPrefixCacheProducer | None:
        if self._prefix is None:
            self._prefix = self._handle.find(ApproxPrefixCacheProducer) if self._handle else []
        return self._prefix[0] if self._prefix else None

    def produce(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        slo = parse_slo(request.headers)
        out = RequestPredictions(slo)
        request.plugin_state[PREDICTIONS_KEY] = out
        prefix = self._prefix_producer()
        blocks: dict[str, int] = {}
        total, per_block = 0, 0.0
        if prefix is not None:
            match = prefix.match(request)
            blocks, total = match.matched, len(match.hashes)
            per_block = float(prefix.tokens_per_block)
        tokens = float(request.prompt_tokens)
        keys = [v.key for v in endpoints]
        rows = []
        if endpoints:
            self._mean_inflight = sum(v.inflight_tokens for v in endpoints) / len(endpoints)
        for key, v in zip(keys, endpoints, strict=True):
            matched = blocks.get(key, 0)
            out.prefix_scores[key] = matched / total if total else 0.0
            # Uncached tokens from the matched blocks, not prompt * score: the index hashes
            # at most maxPrefixBlocksToMatch blocks, so a long prompt whose hashed head is
            # all cached scores 1.0 while its tail still has to be computed.
            row = self._row(tokens, max(0.0, tokens - matched * per_block), v, tokens)
            out.states[key] = row
            rows.append(row)
        if not self.params.predict_in_prepare_data:
            return
        predictor = self.predictor
        tpot_model = predictor.tpot_model
        out.predicted = predictor.ttft_model is not None
        if not out.predicted or not rows:
            return
        factor = self.params.slo_buffer_factor
        started = time.perf_counter()
        ttfts, tpots = predictor.predict_rows(rows)
        assert ttfts is not None
        ttfts_q, tpots_q = predictor.predict_rows(rows, quantile=True)
        judge_q = self.params.objective_type == "quantile"
        ttft_slo, tpot_slo, any_slo = slo.ttft, slo.tpot, slo.any
        for i, (key, v) in enumerate(zip(keys, endpoints, strict=True)):
            ttft, tpot = ttfts[i], tpots[i] if tpots is not None else None
            ttft_q = ttfts_q[i] if ttfts_q is not None else None
            tpot_q = tpots_q[i] if tpots_q is not None else None
            # The headroom is measured against the quantile when asked for (and trained).
            jt = ttft_q if judge_q and ttft_q is not None else ttft
            jp = tpot_q if judge_q and tpot_q is not None else tpot
            out.by_endpoint[key] = Prediction(
                ttft, tpot, _headroom(ttft_slo, any_slo, jt, factor),
                _headroom(tpot_slo, any_slo, jp, factor),
                out.prefix_scores[key], v.inflight_requests, v.metrics.kv_usage, v.queue,
                ttft_q, tpot_q)
        elapsed = time.perf_counter() - started
        pair = (request.client_model, request.target_model)
        me = (self.name, self.type_name, *pair)
        m.TTFT_PREDICTION_DURATION.labels(*pair).observe(elapsed)
        m.LLMD_TTFT_PREDICTION_DURATION.labels(*me).observe(elapsed)
        if tpot_model is not None:
            m.TPOT_PREDICTION_DURATION.labels(*pair).observe(elapsed)
            m.LLMD_TPOT_PREDICTION_DURATION.labels(*me).observe(elapsed)

    def _row(self, tokens: float, uncached: float, v: EndpointView, adding: float,
             ) -> tuple[float, ...]:
        """The model's input row (:meth:`EndpointState.row`) for endpoint ``v`` now;
        ``adding``: the tokens in flight this request adds there (its prompt at the pick, 0
        once it is there)."""
        running = float(v.metrics.running)
        recent = self._relative_tpot(v.key)
        return (tokens, uncached, uncached * (running + 1.0), float(v.queue), running,
                v.metrics.kv_usage, float(v.inflight_tokens),
                float(self._prefilling.get(v.key, 0)),
                float(self._prefill_requests.get(v.key, 0)), recent, uncached * recent,
                v.inflight_tokens + adding - self._mean_inflight)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        out = request.plugin_state.get(PREDICTIONS_KEY)
        if not isinstance(out, RequestPredictions):
            return
        key = result.endpoints[0].key
        out.prefilling_at = key
        # The prefill work this request adds there: its uncached tokens as estimated.
        row = out.states.get(key)
        out.prefill_charge = int(row[1]) if row is not None else request.prompt_tokens
        self._prefilling[key] = self._prefilling.get(key, 0) + out.prefill_charge
        self._prefill_requests[key] = self._prefill_requests.get(key, 0) + 1
        prediction = out.by_endpoint.get(key)
        if prediction is None:
            return
        if prediction.ttft is not None:
            m.PREDICTED_TTFT.labels(request.client_model, request.target_model).observe(
                prediction.ttft)
            m.LLMD_PREDICTED_TTFT.labels(self.name, self.type_name, request.client_model,
                                         request.target_model).observe(prediction.ttft)
        if prediction.tpot is not None:
            out.tpot_predictions.append(prediction.tpot)

    def response_streaming(self, request: LLMRequest, response: Response, chunk: bytes,
                           endpoint: EndpointView) -> None:
        if response.ttft is not None:
            self._prefilled(request)
            if self.params.streaming_mode and self.params.max_decode_token_samples_for_prediction:
                self._sample_tpot(request, endpoint)

    def _sample_tpot(self, request: LLMRequest, endpoint: EndpointView) -> None:
        """Upstream's decode-token sampler: count streamed chunks as tokens and, at Poisson
        spaced ones, predict TPOT again from the endpoint's state now (its load while this
        request decodes, which the pick could not know)."""
        out = request.plugin_state.get(PREDICTIONS_KEY)
        model = self.predictor.tpot_model
        if not isinstance(out, RequestPredictions) or model is None:
            return
        p = self.params
        out.tokens += 1
        if out.sampler is None:  # the first token: the first sample comes after it
            import numpy as np

            out.sampler = np.random.default_rng(list(request.request_id.encode()) or None)
            out.next_sample = 2 + int(out.sampler.poisson(p.sampling_mean))
            return
        if out.tokens != out.next_sample or \
                out.samples >= p.max_decode_token_samples_for_prediction:
            return
        row = self._row(float(request.prompt_tokens), 0.0, endpoint, 0.0)
        out.tpot_predictions.append(model(EndpointState.from_row(row).tpot_x()))
        out.samples += 1
        out.next_sample = out.tokens + max(1, int(out.sampler.poisson(p.sampling_mean)))

    def _prefilled(self, request: LLMRequest) -> None:
        """The request's prompt is no longer in prefill (first token, or the end)."""
        out = request.plugin_state.get(PREDICTIONS_KEY)
        if isinstance(out, RequestPredictions) and out.prefilling_at is not None:
            key, out.prefilling_at = out.prefilling_at, None
            take(self._prefilling, key, out.prefill_charge)
            take(self._prefill_requests, key)

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        for counts in (self._prefilling, self._prefill_requests, self._recent_tpot):
            for key in [k for k in counts if k not in keys]:
                del counts[key]
        self._pool_mean = None

    def _record_tpot(self, key: str, tpot: float) -> None:
        """Fold a measured TPOT into the endpoint's recent average; the first sets it."""
        old = self._recent_tpot.get(key)
        self._recent_tpot[key] = tpot if old is None else old + RECENT_WEIGHT * (tpot - old)
        self._pool_mean = None

    def _relative_tpot(self, key: str) -> float:
        """The model's ``relative_tpot``: the endpoint's recent TPOT over the mean of the
        pool's endpoints' (1 for an endpoint with none yet)."""
        mine = self._recent_tpot.get(key)
        if mine is None:
            return 1.0
        if self._pool_mean is None:
            self._pool_mean = sum(self._recent_tpot.values()) / len(self._recent_tpot)
        return mine / self._pool_mean if self._pool_mean > 0 else 1.0

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        self._prefilled(request)
        out = request.plugin_state.get(PREDICTIONS_KEY)
        if not isinstance(out, RequestPredictions) or response.failed:
            return
        if self.params.streaming_mode:
            ttft = response.ttft if response.streamed else None
            tpot = response.tpot if response.streamed and response.completion_tokens > 1 \
                else None
        else:
            ttft, tpot = response.elapsed, None
        row = out.states.get(endpoint.key)
        if row is not None:
            picked = out.by_endpoint.get(endpoint.key)
            self.predictor.observe(EndpointState.from_row(row), ttft, tpot,
                                   (picked.ttft_q, picked.tpot_q) if picked else (None, None))
        if tpot is not None and tpot > 0:
            self._record_tpot(endpoint.key, tpot)
        slo, pair = out.slo, (request.client_model, request.target_model)
        me = (self.name, self.type_name, *pair)
        if (predicted := predicted_tpot(out)) is not None and response.tpot is not None:
            # Upstream reports the predicted TPOT with the measured one, at the end.
            m.PREDICTED_TPOT.labels(*pair).observe(predicted)
            m.LLMD_PREDICTED_TPOT.labels(*me).observe(predicted)
        for kind, value in (("ttft", response.ttft), ("tpot", response.tpot)):
            if value is not None:
                m.LLMD_REQUEST_METRIC.labels(*me, kind).set(value)
        if slo.ttft is not None and response.ttft is not None and response.ttft > slo.ttft:
            m.SLO_VIOLATIONS.labels(*pair, "ttft").inc()
            m.LLMD_SLO_VIOLATIONS.labels(*me, "ttft").inc()
        if slo.tpot is not None and response.tpot is not None and response.tpot > slo.tpot:
            m.SLO_VIOLATIONS.labels(*pair, "tpot").inc()
            m.LLMD_SLO_VIOLATIONS.labels(*me, "tpot").inc()


def predicted_tpot(out: RequestPredictions) -> float | None:
    """The TPOT predicted for the request's endpoint as reported: the mean of the pick's
    prediction and the in-stream ones (None without any)."""
    preds = out.tpot_predictions
    return sum(preds) / len(preds) if preds else None


def _headroom(slo: float | None, any_slo: bool, predicted: float | None,
              factor: float) -> float:
    if predicted is None:
        return 0.0
    if slo is None:
        return -predicted if not any_slo else 0.0
    return slo * factor - predicted
