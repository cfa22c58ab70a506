"""``destination-endpoint-served-verifier``: tells a conformance test which endpoint the
proxy really sent the request to.

Upstream registers it for its conformance tests: the proxy reports the endpoint it used as
dynamic metadata ``envoy.lb`` → ``x-gateway-destination-endpoint-served``, forwarded to the
EPP with the response headers; this plugin copies it into the response header
``x-conformance-test-served-endpoint`` (or says what was missing).
"""

from __future__ import annotations

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import Response, ResponseReceived
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest

RESULT_HEADER = "x-conformance-test-served-endpoint"
LB_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"


class DestinationEndpointServedVerifier(Plugin, ResponseReceived):
    """Response header ``x-conformance-test-served-endpoint`` = the served endpoint from the
    response's ``envoy.lb`` metadata, or ``fail: missing envoy lb metadata`` / ``fail:
    missing destination endpoint served metadata``."""

    type_name = "destination-endpoint-served-verifier"

    def response_received(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        lb = response.metadata.get(LB_NAMESPACE)
        if not isinstance(lb, dict):
            response.set_headers[RESULT_HEADER] = "fail: missing envoy lb metadata"
            return
        served = lb.get(SERVED_KEY)
        if not isinstance(served, str):
            response.set_headers[RESULT_HEADER] = (
                "fail: missing destination endpoint served metadata")
            return
        response.set_headers[RESULT_HEADER] = served
