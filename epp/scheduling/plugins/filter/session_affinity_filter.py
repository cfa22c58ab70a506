"""``session-affinity-filter`` (llm-d-router v0.10): pin a session to the endpoint that served
it, as a hard constraint, with one of two strategies.

``encoded_endpoint_header`` (default): the response carries a token naming the endpoint in
``encodedEndpointHeaderConfig.header`` (default ``x-session-token``); a request that sends it
back keeps only that endpoint. Upstream's token is base64 of the pod's ``namespace/name``;
ours is the same opaque HMAC token ``session-affinity-scorer`` writes (a client cannot forge
one to pick an endpoint), so the two plugins understand each other's tokens.

``session_id``: the client sends an opaque id, read from ``sessionIdConfig.sources`` in order
(a request ``header`` or a request ``attribute`` an earlier plugin published, e.g.
``agent-identity``); the EPP binds the id to the endpoint that served it, bindings unused for
``evictionTtlSeconds`` are dropped (swept every ``evictionSweepSeconds``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import PreRequest, Response, ResponseReceived
from epp.scheduling.plugin import Filter
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from shared.plugins import Handle

DEFAULT_TOKEN_HEADER = "x-session-token"
DEFAULT_SESSION_ID_HEADER = "x-session-id"
#: One random key per process, shared by every session plugin in it.
_PROCESS_KEY = secrets.token_bytes(32)


def endpoint_identity(view: EndpointView) -> str:
    """What a session token names: ``namespace/name@ip:port``."""
    ep = view.endpoint
    return f"{ep.namespace}/{ep.name}@{view.key}"


def session_token(key: bytes, identity: str) -> str:
    """The 32-character token of ``identity`` under ``key`` (base64url of 24 HMAC bytes)."""
    mac = hmac.new(key, identity.encode(), hashlib.sha256).digest()[:24]
    return base64.urlsafe_b64encode(mac).decode()


def process_key(handle: Handle | None) -> bytes:
    """The token key of this EPP: ``--session-token-key-file``'s, else the process's."""
    settings = getattr(handle, "settings", None)
    return getattr(settings, "session_token_key", None) or _PROCESS_KEY


@dataclass(frozen=True, slots=True)
class EncodedEndpointHeaderConfig:
    """``header``: request and response header carrying the endpoint token."""

    header: str = DEFAULT_TOKEN_HEADER


@dataclass(frozen=True, slots=True)
class SessionIdSource:
    """Exactly one of ``header`` (a request header) or ``attribute`` (a request attribute
    published by an earlier plugin)."""

    header: str = ""
    attribute: str = ""

    def __post_init__(self) -> None:
        if bool(self.header) == bool(self.attribute):
            raise ValueError("sessionIdConfig.sources: exactly one of header or attribute "
                             "must be set")


@dataclass(frozen=True, slots=True)
class SessionIdConfig:
    """``sources`` in priority order (default one header ``x-session-id``),
    ``evictionTtlSeconds`` (300), ``evictionSweepSeconds`` (10)."""

    sources: list[SessionIdSource] = field(
        default_factory=lambda: [SessionIdSource(header=DEFAULT_SESSION_ID_HEADER)])
    eviction_ttl_seconds: float = 300.0
    eviction_sweep_seconds: float = 10.0

    def __post_init__(self) -> None:
        if not self.sources:
            # upstream fills an empty list with the default source
            object.__setattr__(self, "sources", [SessionIdSource(header=DEFAULT_SESSION_ID_HEADER)])
        if self.eviction_ttl_seconds <= 0:
            raise ValueError(f"sessionIdConfig.evictionTtlSeconds must be > 0, got "
                             f"{self.eviction_ttl_seconds}")
        if self.eviction_sweep_seconds <= 0:
            raise ValueError(f"sessionIdConfig.evictionSweepSeconds must be > 0, got "
                             f"{self.eviction_sweep_seconds}")


@dataclass(frozen=True, slots=True)
class SessionAffinityFilterParameters:
    """``strategy``, ``profileName`` (the profile whose pick is pinned; default the primary),
    and the block of the chosen strategy."""

    strategy: Literal["encoded_endpoint_header", "session_id"] = "encoded_endpoint_header"
    profile_name: str = ""
    encoded_endpoint_header_config: EncodedEndpointHeaderConfig = field(
        default_factory=EncodedEndpointHeaderConfig)
    session_id_config: SessionIdConfig = field(default_factory=SessionIdConfig)


def session_id(request: LLMRequest, sources: Sequence[SessionIdSource]) -> str:
    """The first non-empty id among ``sources`` ("" when none)."""
    for source in sources:
        if source.header:
            value = request.headers.get(source.header.strip().lower(), "")
        else:
            raw = request.plugin_state.get(source.attribute)
            value = raw if isinstance(raw, str) else ""
        if value.strip():
            return value.strip()
    return ""


class SessionAffinityFilter(Filter, PreRequest, ResponseReceived):
    """encoded_endpoint_header: keep = [the candidate the token names] if it is a candidate,
    else every candidate; the response gets the token of the (``profileName``'s) pick.

    session_id: keep = [bound endpoint] if the id is bound and that endpoint is a candidate,
    else every candidate. After the pick: an unbound id binds to the pick; a bound id
    refreshes its binding when the pick is the bound endpoint, and moves to the pick only
    when the bound endpoint was not a candidate. Never returns an empty set."""

    type_name = "session-affinity-filter"
    parameters_type = SessionAffinityFilterParameters
    params: SessionAffinityFilterParameters

    def __init__(self, name: str = "", params: Any = None, key: bytes = b"",
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name, params)
        self._key = key or process_key(None)
        self._clock = clock
        self.header = (self.params.encoded_endpoint_header_config.header.strip().lower()
                       or DEFAULT_TOKEN_HEADER)
        #: session id → (endpoint key, last seen)
        self.bindings: dict[str, tuple[str, float]] = {}
        self._last_sweep = clock()

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> SessionAffinityFilter:
        return cls(name, params, key=process_key(handle))

    @property
    def by_id(self) -> bool:
        """True with the ``session_id`` strategy."""
        return self.params.strategy == "session_id"

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        target = self.target(request, endpoints)
        return [target] if target is not None else endpoints

    def target(self, request: LLMRequest,
               endpoints: Sequence[EndpointView]) -> EndpointView | None:
        """The candidate the request's session names (None: no session, or its endpoint is
        not a candidate)."""
        if self.by_id:
            return self._target_by_id(request, endpoints)
        sent = request.headers.get(self.header)
        if not sent:
            return None
        for view in endpoints:
            if hmac.compare_digest(self.token(view), sent):
                return view
        return None

    def token(self, view: EndpointView) -> str:
        """The session token of ``view``."""
        return session_token(self._key, endpoint_identity(view))

    def _target_by_id(self, request: LLMRequest,
                      endpoints: Sequence[EndpointView]) -> EndpointView | None:
        sid = session_id(request, self.params.session_id_config.sources)
        bound = self.bindings.get(sid) if sid else None
        if bound is None:
            return None
        target = next((v for v in endpoints if v.key == bound[0]), None)
        # remembered for pre_request: a binding moves only when its endpoint was not there
        request.plugin_state[self.name] = target is not None
        return target

    def _pick(self, result: SchedulingResult) -> EndpointView | None:
        profile = self.params.profile_name or result.primary_profile
        found = result.results.get(profile)
        return found.picked[0] if found is not None and found.picked else None

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        picked = self._pick(result)
        if not self.by_id:
            if picked is not None:
                request.plugin_state[self.name] = picked
            return
        self._sweep()
        sid = session_id(request, self.params.session_id_config.sources)
        if not sid or picked is None:
            return
        now = self._clock()
        bound = self.bindings.get(sid)
        if bound is None or bound[0] == picked.key or request.plugin_state.get(self.name) is False:
            self.bindings[sid] = (picked.key, now)

    def response_received(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        if self.by_id:
            return
        target = request.plugin_state.get(self.name) if self.params.profile_name else endpoint
        if isinstance(target, EndpointView):
            response.set_headers[self.header] = self.token(target)

    def _sweep(self) -> None:
        """Drop bindings unused for longer than the TTL (at most once per sweep period)."""
        config = self.params.session_id_config
        now = self._clock()
        if now - self._last_sweep < config.eviction_sweep_seconds:
            return
        self._last_sweep = now
        ttl = config.eviction_ttl_seconds
        for sid in [s for s, (_, seen) in self.bindings.items() if now - seen > ttl]:
            del self.bindings[sid]
