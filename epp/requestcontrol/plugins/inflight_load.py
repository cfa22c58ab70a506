"""``inflight-load-producer``: counts the requests and estimated tokens this EPP has in
flight on each endpoint (what ``queue``, token-load and concurrency plugins read)."""

from __future__ import annotations

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import PreRequest, Response, ResponseComplete
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult


class InflightLoadProducer(PreRequest, ResponseComplete, Plugin):
    """At the pick: +1 request and +``prompt_tokens`` on the picked endpoint; at the end of
    the exchange (success, error or broken stream): the same back, never below 0."""

    type_name = "inflight-load-producer"

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        result.endpoints[0].start_request(request.prompt_tokens)

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        endpoint.end_request(request.prompt_tokens)
