"""``session-affinity-scorer`` (llm-d): send a conversation back to the endpoint that served
its previous turn, while that endpoint is healthy and not saturated.

The response carries header ``x-session-token``; a request that sends it back scores 1 on
the endpoint the token names and 0 elsewhere. Unlike llm-d's token (base64 of the pod name,
which a client can forge to pick any pod), ours is opaque and tamper-proof: the first 24
bytes, base64url, of ``HMAC-SHA256(key, namespace/name@ip:port)`` of the endpoint. Without
the key a client cannot make a token for an endpoint it was not served by, learns nothing
from one, and a token only ever *prefers* one of the current candidates: a forged, stale
(endpoint gone) or foreign-key token matches nothing and the request is scheduled as if it
had none. The key comes from ``--session-token-key-file``; without it a random key per
process (tokens then lapse when the EPP restarts, and replicas do not share them).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from typing import Any

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import Response, ResponseReceived
from epp.scheduling.plugin import EndpointsRemoved, Scorer
from epp.scheduling.request import LLMRequest
from shared.plugins import Handle

SESSION_HEADER = "x-session-token"
#: Saturation as upstream's utilization detector defaults: an endpoint at or past either
#: threshold loses its affinity until it drains.
QUEUE_DEPTH_THRESHOLD = 5
KV_CACHE_UTIL_THRESHOLD = 0.8
#: One random key per process, shared by every instance of the scorer in it.
_PROCESS_KEY = secrets.token_bytes(32)


def endpoint_identity(view: EndpointView) -> str:
    """What a session token names: ``namespace/name@ip:port``."""
    ep = view.endpoint
    return f"{ep.namespace}/{ep.name}@{view.key}"


def session_token(key: bytes, identity: str) -> str:
    """The 32-character token of ``identity`` under ``key`` (base64url of 24 HMAC bytes)."""
    mac = hmac.new(key, identity.encode(), hashlib.sha256).digest()[:24]
    return base64.urlsafe_b64encode(mac).decode()


def process_key(handle: Handle) -> bytes:
    """The token key of this EPP: ``--session-token-key-file``'s, else the process's."""
    settings = getattr(handle, "settings", None)
    return getattr(settings, "session_token_key", None) or _PROCESS_KEY


class SessionAffinityScorer(Scorer, ResponseReceived, EndpointsRemoved):
    """score = 1 for the candidate the request's ``x-session-token`` names when its queue
    is below 5 and its KV-cache use below 0.8; 0 otherwise (no token: 0 everywhere)."""

    type_name = "session-affinity-scorer"
    bounded = True

    def __init__(self, name: str = "", params: Any = None, key: bytes | None = None) -> None:
        super().__init__(name, params)
        self._key = key or _PROCESS_KEY
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
        sent = request.headers.get(SESSION_HEADER)
        if not sent or len(sent) != 32:
            return scores
        for i, view in enumerate(endpoints):
            if hmac.compare_digest(self.token(view), sent):
                if (view.queue < QUEUE_DEPTH_THRESHOLD
                        and view.metrics.kv_usage < KV_CACHE_UTIL_THRESHOLD):
                    scores[i] = 1.0
                break
        return scores

    def response_received(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        response.set_headers[SESSION_HEADER] = self.token(endpoint)

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        for key in [k for k in self._tokens if k not in keys]:
            del self._tokens[key]
