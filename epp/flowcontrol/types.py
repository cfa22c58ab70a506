"""What goes into the flow controller and what comes out of it.

A request enters as a :class:`FlowControlRequest` and leaves with exactly one :class:`Outcome`.
Outcomes carry upstream's names (they are the ``outcome`` label of the flow-control
metrics); :func:`error_for` turns a non-dispatched outcome into the error the client sees,
with llm-d-router v0.10's status codes and its ``x-llm-d-request-dropped-reason`` header.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from shared.errors import GatewayError, ServiceUnavailable, TooManyRequests

#: The queue type holding a :class:`QueueItem` (:class:`epp.flowcontrol.queues.FlowQueue`): a
#: type parameter, so this module does not import the queues that import it.
QueueT = TypeVar("QueueT")

#: Header that names a request's flow (tenant) inside its priority band (GIE v1.5's name,
#: the deprecated alias in llm-d-router v0.10).
FAIRNESS_ID_HEADER = "x-gateway-inference-fairness-id"
#: llm-d-router v0.10's name for it; it wins over the alias.
LLMD_FAIRNESS_ID_HEADER = "x-llm-d-inference-fairness-id"
#: Agent session headers (v0.10's ``agent-identity`` reads these, first match wins: Claude
#: Code, OpenCode, Codex, Codex legacy).
AGENT_SESSION_HEADERS = ("x-claude-code-session-id", "x-session-affinity", "session-id",
                         "session_id")
#: Where the ``agent-identity`` plugin publishes a request's agent session (upstream's key).
AGENT_IDENTITY_KEY = "agent-identity"
#: The flow of requests without that header (upstream's value).
DEFAULT_FAIRNESS_ID = "default-flow"
#: Response header naming why a request was refused or evicted (llm-d-router v0.10).
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"


def fairness_id(request: HasHeaders, agents: bool = False) -> str:
    """The request's flow within its band: ``x-llm-d-inference-fairness-id`` (v0.10), else
    ``x-gateway-inference-fairness-id``, else the session the ``agent-identity`` plugin
    published, else (``agents``) the first agent session header, else the default flow."""
    h = request.headers
    found = h.get(LLMD_FAIRNESS_ID_HEADER) or h.get(FAIRNESS_ID_HEADER)
    if not found:
        agent = getattr(request, "plugin_state", {}).get(AGENT_IDENTITY_KEY)
        found = agent if isinstance(agent, str) else None
    if not found and agents:
        found = next((v for name in AGENT_SESSION_HEADERS if (v := h.get(name))), None)
    return found or DEFAULT_FAIRNESS_ID


class HasHeaders(Protocol):
    """Anything with request headers (an LLMRequest)."""

    @property
    def headers(self) -> Mapping[str, str]: ...


class DroppedReason(enum.StrEnum):
    """The values of :data:`DROPPED_REASON_HEADER` (upstream v0.10's)."""

    SATURATED = "rejected-saturated"
    NO_ENDPOINTS = "rejected-no-endpoints"
    TTL_EXPIRED = "rejected-ttl-expired"
    CONTEXT_CANCELLED = "rejected-context-cancelled"
    SHUTTING_DOWN = "rejected-shutting-down"
    EVICTED = "evicted"
    EVICTED_QUEUE_PRESSURE = "evicted-queue-pressure"


class Outcome(enum.Enum):
    """The one final state of a request in flow control (upstream's ``QueueOutcome`` names)."""

    DISPATCHED = "Dispatched"
    #: Refused before queueing: a capacity limit was met (429).
    REJECTED_CAPACITY = "RejectedCapacity"
    #: Refused before queueing for another reason, e.g. the controller is shutting down (503).
    REJECTED_OTHER = "RejectedOther"
    #: Refused at a capacity limit while the pool has no endpoints (503, upstream v0.10).
    REJECTED_NO_ENDPOINTS = "RejectedNoEndpoints"
    #: Waited longer than its TTL (429; 503 when the pool has no endpoints — upstream v0.10).
    EVICTED_TTL = "EvictedTTL"
    #: The client went away while it waited (no one is left to answer).
    EVICTED_CONTEXT_CANCELLED = "EvictedContextCancelled"
    #: Removed while queued for another reason, e.g. shutdown (503).
    EVICTED_OTHER = "EvictedOther"
    #: Ours, not upstream's: pushed out of a full queue by a higher-priority request (429).
    EVICTED_DISPLACED = "EvictedDisplaced"


@dataclass(frozen=True, slots=True)
class FlowKey:
    """A flow: one fairness id (tenant) inside one priority band."""

    fairness_id: str
    priority: int


@dataclass(slots=True)
class FlowControlRequest:
    """A request as flow control sees it (upstream's ``FlowControlRequest``)."""

    request_id: str
    fairness_id: str = DEFAULT_FAIRNESS_ID
    priority: int = 0
    #: Request body bytes; counts against ``maxBytes``.
    byte_size: int = 0
    model_name: str = ""
    target_model_name: str = ""
    #: Event-loop time the request arrived at the EPP (``None``: when it reaches flow control).
    received_at: float | None = None
    #: Seconds this request may wait; ``None`` or 0 uses ``defaultRequestTTL``.
    ttl: float | None = None
    #: Request headers; the SLO-deadline ordering reads ``x-slo-ttft-ms`` from them.
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def flow_key(self) -> FlowKey:
        return FlowKey(self.fairness_id, self.priority)


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """A finished response's token counts (its ``usage``), with the prompt estimate that
    was charged when it was dispatched."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    estimated_prompt_tokens: int = 0


@dataclass(slots=True, eq=False)
class QueueItem(Generic[QueueT]):
    """A request while flow control holds it. Finalized exactly once (see ``outcome``)."""

    request: FlowControlRequest
    #: Event-loop time the request entered flow control (its logical enqueue time).
    enqueued_at: float
    #: Absolute event-loop deadline, or ``None`` when it may wait until cancelled.
    deadline: float | None
    #: Arrival order; breaks every ordering tie so equal keys stay first-come first-served.
    seq: int
    future: asyncio.Future[Outcome]
    outcome: Outcome | None = None
    #: The queue holding it, or ``None`` once it left (dispatched, evicted) or before it entered.
    queue: QueueT | None = None
    #: Ordering key given by the band's ordering policy when it was queued.
    key: tuple[float, float] = (0.0, 0.0)
    #: Released by the dispatcher, and its caller has not resumed yet to make its pick.
    in_transit: bool = False

    @property
    def received_at(self) -> float:
        r = self.request.received_at
        return self.enqueued_at if r is None else r


class FlowControlQueueFull(TooManyRequests):
    """429: the pool has endpoints but no room for this request now (backpressure)."""

    code = "flow_control_queue_full"

    def __init__(self, message: str, *, retry_after: int, code: str | None = None,
                 reason: DroppedReason = DroppedReason.SATURATED) -> None:
        super().__init__(message, code=code)
        #: Seconds; sent as the ``retry-after`` header.
        self.retry_after = retry_after
        #: Headers sent with the error (the dropped reason).
        self.extra_headers = {DROPPED_REASON_HEADER: reason.value}


class FlowControlUnavailable(ServiceUnavailable):
    """503: no serving capacity exists (no endpoints), the client went away, or flow control
    is shutting down."""

    code = "flow_control_unavailable"

    def __init__(self, message: str, *, retry_after: int, code: str | None = None,
                 reason: DroppedReason = DroppedReason.SHUTTING_DOWN) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after
        self.extra_headers = {DROPPED_REASON_HEADER: reason.value}


def error_for(outcome: Outcome, retry_after: int, *,
              pool_empty: bool = False) -> GatewayError | None:
    """The error a non-dispatched ``outcome`` ends the request with (``None`` when dispatched).

    llm-d-router v0.10's rule: 429 means capacity exists but is contended (backpressure), 503
    that no serving capacity exists. So a full queue and an expired TTL answer 429 while the
    pool has endpoints and 503 (``rejected-no-endpoints``) while it has none
    (``pool_empty``); client cancellation and shutdown answer 503 (upstream answers 500 for
    other internal failures; a 503 tells the client to retry, which a restarting EPP wants).
    """
    match outcome:
        case Outcome.DISPATCHED:
            return None
        case Outcome.REJECTED_NO_ENDPOINTS:
            return _no_endpoints("the pool has no endpoints and the queue is full",
                                 retry_after)
        case Outcome.REJECTED_CAPACITY:
            if pool_empty:
                return _no_endpoints("the pool has no endpoints and the queue is full",
                                     retry_after)
            return FlowControlQueueFull(
                "flow control queue is full for this priority; retry later",
                retry_after=retry_after)
        case Outcome.EVICTED_DISPLACED:
            return FlowControlQueueFull(
                "displaced from the flow control queue by higher-priority requests; retry later",
                retry_after=retry_after, code="flow_control_displaced",
                reason=DroppedReason.EVICTED_QUEUE_PRESSURE)
        case Outcome.EVICTED_TTL:
            if pool_empty:
                return _no_endpoints("request timed out in the flow control queue and the "
                                     "pool has no endpoints", retry_after)
            return FlowControlQueueFull(
                "request timed out in the flow control queue; retry later",
                retry_after=retry_after, code="flow_control_ttl_expired",
                reason=DroppedReason.TTL_EXPIRED)
        case Outcome.EVICTED_CONTEXT_CANCELLED:
            return FlowControlUnavailable(
                "client disconnected while queued", retry_after=retry_after,
                code="client_disconnected", reason=DroppedReason.CONTEXT_CANCELLED)
        case _:
            return FlowControlUnavailable(
                "flow control is not running (shutting down)", retry_after=retry_after)


def _no_endpoints(message: str, retry_after: int) -> FlowControlUnavailable:
    return FlowControlUnavailable(message, retry_after=retry_after, code="no_endpoints",
                                  reason=DroppedReason.NO_ENDPOINTS)
