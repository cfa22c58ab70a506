"""``session-affinity-scorer`` (llm-d): prefer the endpoint that served the session's
previous turn, while that endpoint is healthy and not saturated; the soft counterpart of
``session-affinity-filter``, with the same parameters (llm-d-router v0.10: ``strategy``
``encoded_endpoint_header`` or ``session_id``, ``profileName``,
``encodedEndpointHeaderConfig``, ``sessionIdConfig``).

With ``encoded_endpoint_header`` (default) the response carries header ``x-session-token``; a
request that sends it back scores 1 on the endpoint the token names and 0 elsewhere. Unlike
llm-d's token (base64 of the pod name, which a client can forge to pick any pod), ours is
opaque and tamper-proof: the first 24 bytes, base64url, of
``HMAC-SHA256(key, namespace/name@ip:port)`` of the endpoint. Without the key a client cannot
make a token for an endpoint it was not served by, learns nothing from one, and a token only
ever *prefers* one of the current candidates: a forged, stale (endpoint gone) or foreign-key
token matches nothing and the request is scheduled as if it had none. The key comes from
``--session-token-key-file``; without it a random key per process (tokens then lapse when the
EPP restarts, and replicas do not share them). With ``session_id`` the EPP keeps the binding
(see the filter).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import PreRequest, Response, ResponseReceived
from epp.scheduling.plugin import EndpointsRemoved, Scorer
from epp.scheduling.plugins.filter.session_affinity_filter import (
    SessionAffinityFilter,
    SessionAffinityFilterParameters,
    endpoint_identity,
    process_key,
    session_token,
)
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from shared.plugins import Handle

SESSION_HEADER = "x-session-token"
#: Saturation as upstream's utilization detector defaults: an endpoint at or past either
#: threshold loses its affinity until it drains.
QUEUE_DEPTH_THRESHOLD = 5
KV_CACHE_UTIL_THRESHOLD = 0.8


class SessionAffinityScorer(Scorer, PreRequest, ResponseReceived, EndpointsRemoved):
    """score = 1 for the candidate the request's session names (token or bound session id)
    when its queue is below 5 and its KV-cache use below 0.8; 0 otherwise (no session: 0
    everywhere)."""

    type_name = "session-affinity-scorer"
    parameters_type = SessionAffinityFilterParameters
    params: SessionAffinityFilterParameters
    bounded = True

    def __init__(self, name: str = "", params: Any = None, key: bytes | None = None) -> None:
        super().__init__(name, params)
        self._key = key or process_key(None)
        self._session = SessionAffinityFilter(self.name, self.params, key=self._key)
        #: endpoint key -> (the endpoint identity the token was made for, the token)
        self._tokens: dict[str, tuple[str, str]] = {}

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> SessionAffinityScorer:
        return cls(name, params, key=process_key(handle))

    def token(self, view: EndpointView) -> str:
        """The session token of ``view`` (cached per endpoint)."""
        identity = endpoint_identity(view)
        cached = self._tokens.get(view.key)
        if cached is not None and cached[0] == identity:
            return cached[1]
        token = session_token(self._key, identity)
        self._tokens[view.key] = (identity, token)
        return token

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        scores = [0.0] * len(endpoints)
        if self._session.by_id:
            target = self._session.target(request, endpoints)
        else:
            sent = request.headers.get(self._session.header)
            target = None
            if sent and len(sent) == 32:
                target = next((v for v in endpoints
                               if hmac.compare_digest(self.token(v), sent)), None)
        if (target is not None and target.queue < QUEUE_DEPTH_THRESHOLD
                and target.metrics.kv_usage < KV_CACHE_UTIL_THRESHOLD):
            scores[endpoints.index(target)] = 1.0
        return scores

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self._session.pre_request(request, result)

    def response_received(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        self._session.response_received(request, response, endpoint)

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        for key in [k for k in self._tokens if k not in keys]:
            del self._tokens[key]


__all__ = ["SESSION_HEADER", "SessionAffinityScorer", "endpoint_identity", "session_token"]
