"""``request-metrics-recorder``: the per-request series of :mod:`epp.telemetry`
(``inference_objective_*``) under upstream's names."""

from __future__ import annotations

from typing import Any, NamedTuple

from epp import telemetry as m
from epp.datastore import EndpointView
from epp.requestcontrol.plugin import PreRequest, Response, ResponseComplete
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult

#: Model pairs whose series are kept at hand; past this (clients choose ``model``) each
#: request looks its series up again, which is correct, only slower.
MAX_CACHED_PAIRS = 4096


class _Series(NamedTuple):
    """One (model, target model) pair's series, looked up once."""

    requests: Any
    running: Any
    request_sizes: Any
    duration: Any
    response_sizes: Any
    input_tokens: Any
    output_tokens: Any
    ntpot: Any
    ttft: Any
    tpot: Any
    ttft_latest: Any
    tpot_latest: Any
    cached_tokens: Any


class RequestMetricsRecorder(PreRequest, ResponseComplete, Plugin):
    """At the pick: request count (by priority), running gauge, request size. At the end:
    running gauge back; an error (status or ``stream_broken``), or duration, response size,
    usage tokens (prompt, completion, cached), normalized time per output token (duration /
    completion tokens), TTFT and TPOT (histograms, and the latest value
    in ``inference_objective_inference_request_metric{type=ttft|tpot}``)."""

    type_name = "request-metrics-recorder"

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)
        self._series: dict[tuple[str, str], _Series] = {}
        self._requests: dict[tuple[str, str, int], Any] = {}

    def series(self, client: str, target: str) -> _Series:
        """The series of one model pair (label lookups are the costly part of a metric)."""
        s = self._series.get((client, target))
        if s is None:
            pair = (client, target)
            s = _Series(None, m.RUNNING.labels(client),
                        m.REQUEST_SIZES.labels(*pair), m.DURATION.labels(*pair),
                        m.RESPONSE_SIZES.labels(*pair), m.INPUT_TOKENS.labels(*pair),
                        m.OUTPUT_TOKENS.labels(*pair), m.NTPOT.labels(*pair),
                        m.TTFT.labels(*pair), m.TPOT.labels(*pair),
                        m.REQUEST_METRIC.labels(*pair, "ttft"),
                        m.REQUEST_METRIC.labels(*pair, "tpot"),
                        m.CACHED_TOKENS.labels(*pair))
            if len(self._series) < MAX_CACHED_PAIRS:
                self._series[pair] = s
        return s

    def requests(self, client: str, target: str, priority: int) -> Any:
        """``inference_objective_request_total`` of one model pair and priority."""
        key = (client, target, priority)
        c = self._requests.get(key)
        if c is None:
            c = m.REQUESTS.labels(client, target, str(priority))
            if len(self._requests) < MAX_CACHED_PAIRS:
                self._requests[key] = c
        return c

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        s = self.series(request.client_model, request.target_model)
        self.requests(request.client_model, request.target_model, request.priority).inc()
        s.running.inc()
        s.request_sizes.observe(request.request_size)

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        s = self.series(request.client_model, request.target_model)
        s.running.dec()
        if response.failed:
            code = str(response.status) if response.completed else "stream_broken"
            m.ERRORS.labels(request.client_model, request.target_model, code).inc()
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
        if response.tpot is not None:
            s.tpot.observe(response.tpot)
            s.tpot_latest.set(response.tpot)
