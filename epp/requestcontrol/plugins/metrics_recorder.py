"""``request-metrics-recorder``: the per-request series of :mod:`epp.telemetry`
(``inference_objective_*``) under upstream's names."""

from __future__ import annotations

from epp import telemetry as m
from epp.datastore import EndpointView
from epp.requestcontrol.plugin import PreRequest, Response, ResponseComplete
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult


class RequestMetricsRecorder(Plugin, PreRequest, ResponseComplete):
    """At the pick: request count, running gauge, request size. At the end: running gauge
    back; an error (status or ``stream_broken``), or duration, response size, usage tokens
    and normalized time per output token (duration / completion tokens)."""

    type_name = "request-metrics-recorder"

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        m.REQUESTS.labels(request.client_model, request.target_model).inc()
        m.RUNNING.labels(request.client_model).inc()
        m.REQUEST_SIZES.labels(request.client_model, request.target_model).observe(
            request.request_size)

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        labels = (request.client_model, request.target_model)
        m.RUNNING.labels(request.client_model).dec()
        if response.failed:
            code = str(response.status) if response.completed else "stream_broken"
            m.ERRORS.labels(*labels, code).inc()
            return
        m.DURATION.labels(*labels).observe(response.elapsed)
        m.RESPONSE_SIZES.labels(*labels).observe(response.size)
        if response.prompt_tokens:
            m.INPUT_TOKENS.labels(*labels).observe(response.prompt_tokens)
        if response.completion_tokens:
            m.OUTPUT_TOKENS.labels(*labels).observe(response.completion_tokens)
            m.NTPOT.labels(*labels).observe(response.elapsed / response.completion_tokens)
