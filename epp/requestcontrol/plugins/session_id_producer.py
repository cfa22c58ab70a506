"""``session-id-producer`` (llm-d-router v0.10): the request's session id, from a header or a
cookie, as the request attribute ``SessionIDDataKey/<producer name>`` (upstream's key) for
affinity plugins (``sessionIdConfig.sources: [{attribute: SessionIDDataKey/session-id-producer}]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import DataProducer
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest

SESSION_ID_KEY = "SessionIDDataKey"


@dataclass(frozen=True, slots=True)
class SessionIdProducerParameters:
    """Exactly one of ``headerName`` (case-insensitive) or ``cookieName`` (a cookie of the
    ``Cookie`` header)."""

    header_name: str = ""
    cookie_name: str = ""

    def __post_init__(self) -> None:
        if bool(self.header_name.strip()) == bool(self.cookie_name.strip()):
            raise ValueError("exactly one of headerName or cookieName must be set")


class SessionIdProducer(Plugin, DataProducer):
    """session id = header(headerName), or cookie ``cookieName`` of the ``Cookie`` header;
    nothing is published when it is absent or empty (no session preference)."""

    type_name = "session-id-producer"
    parameters_type = SessionIdProducerParameters
    params: SessionIdProducerParameters

    @property
    def key(self) -> str:
        """The request attribute this instance publishes."""
        return f"{SESSION_ID_KEY}/{self.name}"

    def session_id(self, request: LLMRequest) -> str:
        """The request's session id ("" when none)."""
        p = self.params
        if p.header_name.strip():
            return request.headers.get(p.header_name.strip().lower(), "").strip()
        raw = request.headers.get("cookie", "")
        if not raw:
            return ""
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw)
        except CookieError:  # a malformed Cookie header carries no session
            return ""
        morsel = jar.get(p.cookie_name.strip())
        return morsel.value.strip() if morsel is not None else ""

    def produce(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        sid = self.session_id(request)
        if sid:
            request.plugin_state[self.key] = sid
