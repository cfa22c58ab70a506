"""Request-control extension points: the plugin kinds the director calls around scheduling,
in upstream's order.

    parse (Parser) → produce data (DataProducer) → saturation (SaturationDetector, sheddable
    requests only) → admit (Admitter, may await) → schedule → pre-request (PreRequest) →
    response received (ResponseReceived) → each chunk (ResponseStreaming) → the end
    (ResponseComplete)

A plugin may implement several kinds (``inflight-load-producer`` is a PreRequest and a
ResponseComplete plugin). Per-request data goes into ``request.plugin_state`` under the
plugin's name; plugins find each other through the handle their factory gets.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from epp.datastore import EndpointView
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from shared.openai import OpenAIRequest


class Parser(ABC):
    """Reads the request body into the fields routing needs (upstream's ``parser``)."""

    #: Path suffixes this parser claims when several are listed in
    #: ``requestHandler.parsers`` (:mod:`epp.requestcontrol.parser_chain`); none: it takes
    #: every path no earlier parser claimed.
    paths: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def parse(self, body: bytes, path: str) -> OpenAIRequest:
        """The parsed request; raise :class:`shared.errors.BadRequest` for a bad body."""


class DataProducer(ABC):
    """Prepares per-request data before scheduling (prefix match, token ids, load...)."""

    @abstractmethod
    def produce(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        """Write what scorers/filters will read into ``request.plugin_state``."""


class RequestHeaderProcessor(DataProducer):
    """Reads the request's headers into request attributes (``request.plugin_state``) right
    after the request is assembled: these run before every other data producer and before
    admission, as upstream's ``RequestHeaderProcessor`` plugins do."""

    @abstractmethod
    def process_request_header(self, request: LLMRequest) -> None:
        """Publish what the headers say (e.g. an agent's session identity)."""

    def produce(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        self.process_request_header(request)


class Screener(ABC):
    """Narrows the candidates once per request, before every scheduling profile (upstream's
    ``Screener``): a constraint no filter, scorer or picker can undo."""

    @abstractmethod
    def screen(self, request: LLMRequest,
               endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        """The candidates ``request`` may use; raise a GatewayError to refuse it."""


class SaturationDetector(ABC):
    """Says whether the pool is too busy for sheddable (negative-priority) requests."""

    @abstractmethod
    def is_saturated(self, endpoints: Sequence[EndpointView], now: float | None = None) -> bool:
        """True when sheddable requests should be rejected (429)."""


class Admitter(ABC):
    """Accepts or rejects a request before scheduling.

    Reject by raising a :class:`shared.errors.GatewayError` (its status and code reach the
    client). ``admit`` may be a coroutine: a queueing admitter (flow control) awaits until
    the request may go on.
    """

    @abstractmethod
    def admit(self, request: LLMRequest,
              endpoints: Sequence[EndpointView]) -> Awaitable[None] | None:
        """Return (or finish awaiting) to admit; raise to reject."""


class PreRequest(ABC):
    """Runs after the pick, before the request goes out; may add headers to
    ``result.extra_headers`` (e.g. a prefill endpoint)."""

    @abstractmethod
    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        """The request is committed to ``result.endpoints[0]``."""


@dataclass(slots=True)
class Response:
    """The response as request-control plugins see it.

    ``ttft``: seconds from the pick to the first streamed token; for a non-streamed response
    it is set at the end to the whole duration (upstream's ``streamingMode: false``: the
    first token reaches the client with the last). ``tpot`` (seconds per output token after
    the first; duration / tokens when not streamed) is None until usage is known.
    ``completed`` is False when the stream broke before the response ended.
    """

    request_id: str
    status: int = 0
    headers: Mapping[str, str] | None = None
    completed: bool = False
    size: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: ``usage.prompt_tokens_details.cached_tokens`` (0 when the server did not say).
    cached_tokens: int = 0
    elapsed: float = 0.0
    ttft: float | None = None
    tpot: float | None = None
    #: The response is an SSE stream (``text/event-stream``).
    streamed: bool = False
    #: Dynamic metadata the proxy forwarded with the response headers, by namespace.
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: Headers response-received plugins add to the client's response.
    set_headers: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """The stream broke or the server answered 4xx/5xx."""
        return not self.completed or self.status >= 400


class ResponseReceived(ABC):
    """The response headers arrived from the endpoint."""

    @abstractmethod
    def response_received(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        """``response.status`` and ``response.headers`` are set."""


class FirstToken(ABC):
    """The first token of a streamed response arrived: once per request, never for a
    response that is not streamed (cheaper than :class:`ResponseStreaming` when only that
    moment matters: nothing runs per chunk)."""

    @abstractmethod
    def first_token(self, request: LLMRequest, response: Response,
                    endpoint: EndpointView) -> None:
        """``response.ttft`` is set."""


class ResponseStreaming(ABC):
    """Each piece of the response body (only plugins of this kind make the director look at
    chunks, so it costs nothing when none is configured)."""

    @abstractmethod
    def response_streaming(self, request: LLMRequest, response: Response, chunk: bytes,
                           endpoint: EndpointView) -> None:
        """``response.ttft`` is set from the first chunk carrying a token."""


class ResponseMetadata(ABC):
    """The response body has been seen whole (its ``usage`` included): return dynamic
    metadata for the proxy, ``{namespace: {key: value}}`` (upstream's response-body plugins
    writing ``DynamicMetadata``), or None."""

    @abstractmethod
    def response_metadata(self, request: LLMRequest, response: Response,
                          usage: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]] | None:
        """``usage``: the response's ``usage`` object ({} when it had none)."""


class ResponseComplete(ABC):
    """The exchange ended (response end, error or broken stream); called exactly once for
    every request that reached pre-request."""

    @abstractmethod
    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        """``response`` carries status, sizes, usage, elapsed, TTFT and TPOT."""


__all__ = [
    "Admitter",
    "DataProducer",
    "FirstToken",
    "Parser",
    "PreRequest",
    "Response",
    "ResponseComplete",
    "ResponseMetadata",
    "ResponseReceived",
    "ResponseStreaming",
    "SaturationDetector",
]
