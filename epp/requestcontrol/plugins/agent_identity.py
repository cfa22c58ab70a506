"""``agent-identity`` (llm-d-router v0.10): an agent's session id, from the headers coding
agents send, as the request attribute ``agent-identity``.

Flow control uses it as the fairness id when the request names none, so every turn of one
agent session queues in the same flow; ``session-affinity-filter`` / ``-scorer`` can read it
as a ``sessionIdConfig`` source (``attribute: agent-identity``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.requestcontrol.plugin import RequestHeaderProcessor
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest

#: The request attribute (``request.plugin_state`` key) this plugin publishes.
AGENT_IDENTITY = "agent-identity"
#: Built-in headers in priority order: Claude Code, OpenCode, Codex, Codex (older builds).
DEFAULT_SESSION_HEADERS = ("x-claude-code-session-id", "x-session-affinity", "session-id",
                           "session_id")


@dataclass(frozen=True, slots=True)
class AgentIdentityParameters:
    """``additionalSessionHeaders``: more header names, checked before the built-in ones."""

    additional_session_headers: list[str] = field(default_factory=list)


class AgentIdentity(Plugin, RequestHeaderProcessor):
    """agent-identity = the first non-empty value among ``additionalSessionHeaders`` then
    ``x-claude-code-session-id``, ``x-session-affinity``, ``session-id``, ``session_id``;
    no attribute when none is set."""

    type_name = "agent-identity"
    parameters_type = AgentIdentityParameters
    params: AgentIdentityParameters

    def __init__(self, name: str = "", params: AgentIdentityParameters | None = None) -> None:
        super().__init__(name, params)
        extra = [h.strip().lower() for h in self.params.additional_session_headers]
        self.headers = tuple(dict.fromkeys([h for h in extra if h] +
                                           list(DEFAULT_SESSION_HEADERS)))

    def process_request_header(self, request: LLMRequest) -> None:
        for header in self.headers:
            value = request.headers.get(header, "").strip()
            if value:
                request.plugin_state[AGENT_IDENTITY] = value
                return
