"""``request-metrics-recorder``: the per-request series of :mod:`epp.telemetry` under both
upstream names: the deprecated ``inference_objective_*`` and v0.10's ``llm_d_epp_request_*``
(which add ``fairness_id`` and ``priority``). Model names and fairness ids are capped at
1,000 values each (then ``other``), as upstream."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from epp import telemetry as m
from epp.datastore import EndpointView
from epp.requestcontrol.plugin import PreRequest, Response, ResponseComplete, ResponseStreaming
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult

#: Label sets whose series are kept at hand; past this (clients choose ``model`` and the
#: fairness id) each request looks its series up again, which is correct, only slower.
MAX_CACHED_PAIRS = 4096


class _Series(NamedTuple):
    """One label set's series, looked up once (each a :class:`~epp.telemetry.Both` where
    upstream writes a deprecated twin)."""

    requests: Any
    running: Any
    request_sizes: Any
    duration: Any
    response_sizes: Any
    input_tokens: Any
    output_tokens: Any
    ntpot: Any
    ttft: Any  # the deprecated histogram only; the llm_d one carries `streaming`
    ttft_streamed: Any
    ttft_not_streamed: Any
    tpot: Any
    streaming_tpot: Any
    itl: Any
    ttft_latest: Any
    tpot_latest: Any
    cached_tokens: Any
    labels: tuple[str, str, str, str]


class RequestMetricsRecorder(PreRequest, ResponseStreaming, ResponseComplete, Plugin):
    """At the pick: request count, running gauge, request size. On each streamed chunk: the
    inter-token latency (time since the previous chunk). At the end: running gauge back; an
    error (status or ``stream_broken``), or duration, response size, usage tokens (prompt,
    completion, cached), normalized time per output token (duration / completion tokens),
    TTFT (``streaming`` label on the v0.10 name) and TPOT (v0.10: streamed responses only;
    the latest value in ``inference_objective_inference_request_metric{type=ttft|tpot}``)."""

    type_name = "request-metrics-recorder"

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)
        self._series: dict[tuple[str, str, str, int], _Series] = {}
        #: Streamed requests in flight: [their ITL series, the previous chunk's time].
        self._streams: dict[str, list[Any]] = {}

    def series(self, request: LLMRequest) -> _Series:
        """The series of one request's labels (label lookups are the costly part)."""
        fairness = m.fairness_id(request.headers)
        key = (request.client_model, request.target_model, fairness, request.priority)
        s = self._series.get(key)
        if s is None:
            s = _lookup(*m.bounded(request.client_model, request.target_model, fairness),
                        str(request.priority))
            if len(self._series) < MAX_CACHED_PAIRS:
                self._series[key] = s
        return s

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        s = self.series(request)
        s.requests.inc()
        s.running.inc()
        s.request_sizes.observe(request.request_size)

    def response_streaming(self, request: LLMRequest, response: Response, chunk: bytes,
                           endpoint: EndpointView) -> None:
        # Per chunk: one dict lookup and a bisect (measured: the series lookup and a
        # prometheus_client histogram cost 3.8 us a chunk, this about 1 us).
        if not response.streamed or not chunk:
            return
        now = time.monotonic()
        stream = self._streams.get(request.request_id)
        if stream is None:
            self._streams[request.request_id] = [self.series(request).itl, now]
            return
        stream[0].observe(now - stream[1])
        stream[1] = now

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        self._streams.pop(request.request_id, None)
        s = self.series(request)
        s.running.dec()
        if response.failed:
            code = str(response.status) if response.completed else "stream_broken"
            m.ERRORS.labels(*s.labels[:2], code).inc()
            m.LLMD_ERRORS.labels(*s.labels, code).inc()
            return
        s.duration.observe(response.elapsed)
        s.response_sizes.observe(response.size)
        if response.prompt_tokens:
            s.input_tokens.observe(response.prompt_tokens)
        if response.cached_tokens:
            s.cached_tokens.observe(response.cached_tokens)
        if response.completion_tokens:
            s.output_tokens.observe(response.completion_tokens)
            s.ntpot.observe(response.elapsed / response.completion_tokens)
        if response.ttft is not None:
            s.ttft.observe(response.ttft)
            s.ttft_latest.set(response.ttft)
            (s.ttft_streamed if response.streamed else s.ttft_not_streamed).observe(response.ttft)
        if response.tpot is not None:
            s.tpot.observe(response.tpot)
            s.tpot_latest.set(response.tpot)
            if response.streamed and response.completion_tokens > 1:
                s.streaming_tpot.observe(response.tpot)


def _lookup(client: str, target: str, fairness: str, priority: str) -> _Series:
    pair = (client, target)
    labels = (client, target, fairness, priority)
    return _Series(
        requests=m.Both(m.REQUESTS.labels(*pair, priority), m.LLMD_REQUESTS.labels(*labels)),
        running=m.Both(m.RUNNING.labels(client), m.LLMD_RUNNING.labels(*labels)),
        request_sizes=m.Both(m.REQUEST_SIZES.labels(*pair), m.LLMD_REQUEST_SIZES.labels(*labels)),
        duration=m.Both(m.DURATION.labels(*pair), m.LLMD_DURATION.labels(*labels)),
        response_sizes=m.Both(m.RESPONSE_SIZES.labels(*pair),
                              m.LLMD_RESPONSE_SIZES.labels(*labels)),
        input_tokens=m.Both(m.INPUT_TOKENS.labels(*pair), m.LLMD_INPUT_TOKENS.labels(*labels)),
        output_tokens=m.Both(m.OUTPUT_TOKENS.labels(*pair),
                             m.LLMD_OUTPUT_TOKENS.labels(*labels)),
        ntpot=m.Both(m.NTPOT.labels(*pair), m.LLMD_NTPOT.labels(*labels)),
        ttft=m.TTFT.labels(*pair),
        ttft_streamed=m.LLMD_TTFT.labels(*labels, "true"),
        ttft_not_streamed=m.LLMD_TTFT.labels(*labels, "false"),
        tpot=m.TPOT.labels(*pair),
        streaming_tpot=m.LLMD_STREAMING_TPOT.labels(*labels),
        itl=m.LLMD_ITL.labels(*labels),
        ttft_latest=m.REQUEST_METRIC.labels(*pair, "ttft"),
        tpot_latest=m.REQUEST_METRIC.labels(*pair, "tpot"),
        cached_tokens=m.Both(m.CACHED_TOKENS.labels(*pair), m.LLMD_CACHED_TOKENS.labels(*labels)),
        labels=labels,
    )
