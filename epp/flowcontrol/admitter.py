"""Flow control at the director's admission point (on with ``featureGates: [flowControl]``).

The admitter turns the request into a :class:`FlowControlRequest` — flow = its priority and
its ``x-gateway-inference-fairness-id`` header (``default-flow`` without one) — and awaits the
controller: it returns when the request is released, or raises the client's 429/503. It is
also a pre-request and a response-complete plugin: it counts each flow's requests in flight
from the pick to the end of the response (``least-inflight-fairness-policy`` reads them), and
every finished response tells the dispatcher that capacity may have freed.

It is not a plugin type users configure: the feature gate builds it (as upstream swaps its
admission controller), with the pool's saturation detector as the dispatch signal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from epp.datastore import Datastore, EndpointView
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.program_aware import ProgramAwareFairness
from epp.flowcontrol.types import FlowControlRequest, TokenUsage, fairness_id
from epp.requestcontrol.plugin import (
    Admitter,
    PreRequest,
    Response,
    ResponseComplete,
    SaturationDetector,
)
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from modelserver.pd import ROLE_LABEL, can_decode, can_prefill
from shared.plugins import Plugin


def pool_saturation(detector: SaturationDetector, datastore: Datastore) -> Callable[[], float]:
    """The dispatch signal: ``detector``'s saturation of the pool's ready endpoints (its
    ``saturation()`` when it has one; else 1 when it says saturated, 0 otherwise). The
    utilization detector counts picks the servers' metrics do not show yet.

    Per stage for a P/D pool (one with prefill-only endpoints, ``llm-d.ai/role: prefill``
    or ``encode-prefill``): max(saturation of the endpoints that may prefill, saturation of
    those that may decode). A disaggregated request needs both stages, and one mean over
    every endpoint would let a full prefill stage hide behind idle decoders (or the other
    way round)."""
    measure = getattr(detector, "saturation", None)

    def of(views: Sequence[EndpointView]) -> float:
        if measure is not None:
            return float(measure(views))
        return 1.0 if detector.is_saturated(views) else 0.0

    def read() -> float:
        views = datastore.candidates()
        if not any(v.endpoint.labels.get(ROLE_LABEL) in PREFILL_ONLY for v in views):
            return of(views)
        prefill = [v for v in views if can_prefill(v.endpoint.labels)]
        decode = [v for v in views if can_decode(v.endpoint.labels)]
        return max(of(prefill), of(decode))

    return read


#: Roles that serve only the prefill leg: their presence makes a pool disaggregated.
PREFILL_ONLY = frozenset({"prefill", "encode-prefill"})




class FlowControlAdmitter(Plugin, Admitter, PreRequest, ResponseComplete):
    """Holds each request in the flow controller until it may be scheduled."""

    type_name = "flow-control-admitter"

    def __init__(self, controller: FlowController, name: str = "") -> None:
        super().__init__(name)
        self.controller = controller
        #: Agent sessions are programs when some band uses ``program-aware-fairness``: their
        #: headers are read then even without v0.10's ``agent-identity`` plugin in the config.
        self.agents = controller.uses(ProgramAwareFairness)
        self._fid_key = f"{self.name}.fairness_id"

    def _fairness_id(self, request: LLMRequest) -> str:
        """Resolved once per request (the admitter, pick and end must agree)."""
        fid = request.plugin_state.get(self._fid_key)
        if fid is None:
            fid = request.plugin_state[self._fid_key] = fairness_id(request, self.agents)
        return str(fid)

    def admit(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Any:
        headers = request.headers
        return self.controller.admit(FlowControlRequest(
            request_id=request.request_id,
            fairness_id=self._fairness_id(request),
            priority=request.priority,
            byte_size=request.request_size,
            model_name=request.client_model,
            target_model_name=request.target_model,
            headers=headers,
        ))

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self.controller.started(request.priority, self._fairness_id(request),
                                request.prompt_tokens)

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        self.controller.ended(request.priority, self._fairness_id(request), TokenUsage(
            response.prompt_tokens, response.completion_tokens, response.cached_tokens,
            request.prompt_tokens))
