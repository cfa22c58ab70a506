"""The ext_proc stream state machine shared by every service.

Envoy opens one gRPC stream per HTTP request and sends the request headers, body chunks and
trailers, then the response's. What must be answered when depends on the body mode:

* ``BUFFERED``: Envoy waits for the headers answer, then sends the whole body in one message;
  header mutations (and ``clear_route_cache``) ride on the body answer, because the headers
  have not gone upstream yet.
* ``FULL_DUPLEX_STREAMED``: Envoy sends chunks without waiting. The headers answer is held
  until the body is complete, then sent with the mutations, followed by the (possibly
  rewritten) body re-cut into chunks of at most ``MAX_CHUNK`` bytes.
* a headers-only request (``end_of_stream`` on the headers, e.g. ``GET``) is decided at once.

The service ends the stream itself (OK status) as soon as nothing is left to answer: after the
request's end for an exchange that does not want the response, or :data:`RESET_WAIT` after the
response's end. By default Envoy resets the stream right after the response's end, and a reset
that finds a gRPC batch in flight leaks that batch's native memory in grpc.aio
(grpc/grpc#43360); waiting on a plain timer instead, the reset just cancels it. With Envoy's
graceful close (``devkit.envoy.GRACEFUL_CLOSE``) Envoy waits for the status instead.

A service subclasses :class:`Exchange` (one object per HTTP request) and hands a factory to
:class:`ExtProcServicer`. Raising :class:`~shared.errors.GatewayError` from a callback ends
the request with that status and an OpenAI-style JSON body.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import structlog
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf.json_format import MessageToDict

from shared import responses as r
from shared import tracing
from shared.errors import GatewayError, PayloadTooLarge, ServiceUnavailable
from shared.headers import header_dict

log = structlog.get_logger(__name__)

_NO_METADATA: Mapping[str, Any] = MappingProxyType({})

#: Default cap on a buffered request body (10 MiB).
DEFAULT_MAX_BODY = 10 * 1024 * 1024
#: Request-body bytes all streams of one service may hold at once (``BodyBudget``): 256 MiB
#: keeps BBR (1 GiB limit in the chart) with room for the copies a body costs on the way
#: (chunks, the joined body, the parsed JSON); docs/reliability.md has the measurement.
DEFAULT_MAX_BUFFERED = 256 * 1024 * 1024

#: How long a stream whose response is over waits for Envoy's reset before ending itself.
RESET_WAIT = 0.1


class BodyMode(enum.IntEnum):
    """Envoy's ``ProcessingMode.BodySendMode`` values."""

    NONE = 0
    STREAMED = 1
    BUFFERED = 2
    BUFFERED_PARTIAL = 3
    FULL_DUPLEX_STREAMED = 4


@dataclass(slots=True)
class RequestDecision:
    """What to do with a complete request (headers + body)."""

    set_headers: dict[str, str] = field(default_factory=dict)
    remove_headers: list[str] = field(default_factory=list)
    clear_route_cache: bool = False
    body: bytes | None = None
    """Replacement body; None sends the original bytes unchanged."""
    metadata: dict[str, dict[str, Any]] | None = None
    """Dynamic metadata by namespace, e.g. ``{"envoy.lb": {...}}``."""


@dataclass(slots=True)
class ResponseHeadersDecision:
    """What to do with the response headers, and whether the whole body is needed."""

    set_headers: dict[str, str] = field(default_factory=dict)
    remove_headers: list[str] = field(default_factory=list)
    buffer_body: bool = False
    """True: collect the whole body and call :meth:`Exchange.on_response_body`; False: pass
    chunks through :meth:`Exchange.on_response_chunk` as they come (SSE)."""


class Exchange:
    """One HTTP request/response seen by a service. Override what you need.

    ``filter_metadata`` holds the namespaces Envoy forwards (``metadata_options.
    forwarding_namespaces``), e.g. ``{"envoy.lb.subset_hint": {...}}``, before
    :meth:`on_request` runs.
    """

    filter_metadata: Mapping[str, Any] = _NO_METADATA
    #: The namespaces Envoy forwarded with the response headers (e.g. ``envoy.lb`` with the
    #: endpoint it served), set before :meth:`on_response_headers` runs.
    response_metadata: Mapping[str, Any] = _NO_METADATA

    #: Set (by the exchange) to a future whose result is an error that must end the exchange
    #: now, whatever Envoy sends meanwhile (e.g. flow control evicting an in-flight request):
    #: the stream answers it with an ImmediateResponse as soon as it resolves.
    interrupt: asyncio.Future[GatewayError] | None = None
    #: The ``traceparent`` on the ext_proc gRPC call itself (Envoy's span for the call, when
    #: Envoy traces); read only while tracing is on (:mod:`shared.tracing`).
    grpc_traceparent: str | None = None

    wants_response: bool = True
    """False for a service with nothing to do on the response path (BBR): its streams end
    once the request is answered, and Envoy skips response processing for them."""

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestDecision:
        """The complete request; ``body`` is empty for a headers-only request."""
        return RequestDecision()

    async def on_response_headers(self, headers: dict[str, str]) -> ResponseHeadersDecision:
        """The upstream's response headers."""
        return ResponseHeadersDecision()

    def on_response_chunk(self, chunk: bytes, end_of_stream: bool) -> bytes:
        """One streamed response chunk; return what the client gets instead."""
        return chunk

    def on_response_body(self, body: bytes) -> bytes:
        """The whole response body (when :attr:`ResponseHeadersDecision.buffer_body`)."""
        return body

    def on_close(self, completed: bool) -> None:
        """The stream ended; ``completed`` is False when it broke before the response ended."""

    def response_end_metadata(self) -> dict[str, dict[str, Any]] | None:
        """Dynamic metadata for Envoy once the whole response body has been seen (sent with
        the answer to the last body message), by namespace; None for none."""
        return None


class BodyBudget:
    """Request-body bytes all streams of one service may hold at once.

    Each stream's body is capped, but many capped bodies at once are not: 120 uploads of
    10 MB pushed BBR past its 1 GiB memory limit (issue 31). A chunk that would take the
    total over ``limit`` ends its stream with a JSON 503 (retry later) instead; the bytes
    are given back when the stream ends.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, n: int) -> bool:
        """Reserve ``n`` bytes; False when that would pass the limit."""
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


class BodyMemoryBusy(ServiceUnavailable):
    """503: the service holds as many request-body bytes as it may; retry."""

    code = "body_memory_busy"


@dataclass(slots=True)
class _Body:
    """A body being collected, capped at ``limit`` bytes (and by the shared ``budget``)."""

    limit: int
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    budget: BodyBudget | None = None
    reserved: int = 0

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise PayloadTooLarge(
                f"request body is larger than the {self.limit}-byte limit",
                code="request_too_large",
            )
        if self.budget is not None and chunk:
            if not self.budget.take(len(chunk)):
                raise BodyMemoryBusy("too many large request bodies in flight on this "
                                     "service; retry shortly")
            self.reserved += len(chunk)
        if chunk:
            self.chunks.append(chunk)

    def release(self) -> None:
        """Give the reserved bytes back to the budget (the stream ended)."""
        if self.budget is not None and self.reserved:
            self.budget.give(self.reserved)
            self.reserved = 0

    def take(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks.clear()
        return data


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):
    """The gRPC ``ExternalProcessor`` service driving one :class:`Exchange` per stream.

    ``request_mode``/``response_mode`` are what Envoy is configured with; when Envoy reports
    its ``protocol_config`` on the stream, that wins.
    """

    def __init__(
        self,
        exchange_factory: Callable[[], Exchange],
        *,
        request_mode: BodyMode = BodyMode.BUFFERED,
        response_mode: BodyMode = BodyMode.NONE,
        max_body: int = DEFAULT_MAX_BODY,
        max_buffered: int | None = None,
    ) -> None:
        self._factory = exchange_factory
        self.request_mode = request_mode
        self.response_mode = response_mode
        self.max_body = max_body
        #: request-body bytes all streams may hold at once (None: unbounded)
        self.budget = BodyBudget(max_buffered) if max_buffered else None

    async def Process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Run one stream; see the module docstring for the protocol."""
        ex = self._factory()
        if tracing.TRACER is not None:
            ex.grpc_traceparent = _traceparent(context)
        stream = _Stream(ex, self.request_mode, self.response_mode, self.max_body)
        stream.body.budget = self.budget
        messages = aiter(requests)
        try:
            while True:
                interrupt = stream.ex.interrupt
                try:
                    if interrupt is None:  # the common case: no task per message
                        msg = await anext(messages)
                    else:
                        msg = await _next_or_interrupt(messages, interrupt)
                except StopAsyncIteration:
                    break
                if msg is None:  # interrupted: the error ends the exchange now
                    assert interrupt is not None
                    # not response_done: the exchange did not complete, it was cut short
                    yield r.immediate_error(interrupt.result())
                    return
                for resp in await stream.handle(msg):
                    yield resp
                    if resp.HasField("immediate_response"):
                        stream.response_done = True
                        return
                if stream.finished:
                    if stream.response_done:
                        stream.close()  # the exchange is over; only the gRPC call is left
                        await asyncio.sleep(RESET_WAIT)
                    return
            stream.half_closed()
        except GatewayError as e:
            stream.response_done = True
            yield r.immediate_error(e)
        finally:
            stream.close()


Responses = list[pb.ProcessingResponse]


async def _next_or_interrupt(messages: AsyncIterator[pb.ProcessingRequest],
                             interrupt: asyncio.Future[GatewayError],
                             ) -> pb.ProcessingRequest | None:
    """The next message, or None when ``interrupt`` resolves first (the read is cancelled:
    the stream ends with the interrupt's error)."""
    if interrupt.done():
        return None
    nxt: asyncio.Future[pb.ProcessingRequest] = asyncio.ensure_future(anext(messages))
    await asyncio.wait((nxt, interrupt), return_when=asyncio.FIRST_COMPLETED)
    if nxt.done():
        return nxt.result()  # raises StopAsyncIteration at the end of the stream
    nxt.cancel()
    return None


def _traceparent(context: Any) -> str | None:
    """The ``traceparent`` gRPC metadata of the call, if any."""
    try:
        metadata = context.invocation_metadata() or ()
    except Exception:  # a test's fake context may have none
        return None
    for key, value in metadata:
        if key == tracing.TRACEPARENT:
            return value if isinstance(value, str) else None
    return None


class _Stream:
    """One gRPC stream: its modes, what has been seen, and the bodies held back.

    Each ``_on_<message>`` method answers one ProcessingRequest kind with the responses to
    send now (possibly none: FULL_DUPLEX holds answers until the body is complete).
    """

    def __init__(self, ex: Exchange, req_mode: BodyMode, resp_mode: BodyMode,
                 max_body: int) -> None:
        self.ex = ex
        self.req_mode = req_mode
        self.resp_mode = resp_mode
        self.headers: dict[str, str] = {}
        self.body = _Body(max_body)
        self.resp_body = _Body(1 << 62)  # responses are the model server's; no cap
        self.resp_decision = ResponseHeadersDecision()
        self.resp_buffered = False
        # Envoy may reset the stream instead of half-closing it once the response is done,
        # so "completed" is judged by what was seen, not by how the stream ended.
        self.request_done = False
        self.response_started = False
        self.response_done = False
        self.closed = False

    async def handle(self, msg: pb.ProcessingRequest) -> Responses:
        if msg.HasField("protocol_config"):
            self.req_mode = BodyMode(msg.protocol_config.request_body_mode)
            self.resp_mode = BodyMode(msg.protocol_config.response_body_mode)
        kind = msg.WhichOneof("request")
        if msg.HasField("metadata_context"):
            found = {ns: MessageToDict(st)
                     for ns, st in msg.metadata_context.filter_metadata.items()}
            if kind == "response_headers":
                self.ex.response_metadata = found
            elif self.ex.filter_metadata is _NO_METADATA:
                self.ex.filter_metadata = found
        if kind == "request_headers":
            return await self._on_request_headers(msg.request_headers)
        if kind == "request_body":
            return await self._on_request_body(msg.request_body)
        if kind == "request_trailers":
            return await self._on_request_trailers()
        if kind == "response_headers":
            return await self._on_response_headers(msg.response_headers)
        if kind == "response_body":
            return self._on_response_body(msg.response_body)
        if kind == "response_trailers":
            return self._on_response_trailers()
        return []

    @property
    def finished(self) -> bool:
        """Nothing is left to answer, so the stream may end here (see the module docstring:
        a stream left waiting for Envoy cost ~130 bytes each, docs/reliability.md "Soak").

        A request-only exchange (``wants_response`` False) ends early only when Envoy sends
        no response body: with a body mode Envoy hands the body's chunks to this stream and
        waits for them back, and a stream that ended meanwhile lost them (the client got the
        headers and an empty body), so the body is passed through to its end instead."""
        return self.response_done or (self.request_done and not self.ex.wants_response
                                      and self.resp_mode is BodyMode.NONE)

    def half_closed(self) -> None:
        """Envoy ended the stream: complete if the request was decided and no response was
        left half-seen (with response processing off, Envoy never shows us one)."""
        if self.request_done and not self.response_started:
            self.response_done = True

    def close(self) -> None:
        """Tell the exchange how it ended (once)."""
        if self.closed:
            return
        self.closed = True
        self.body.release()
        try:
            self.ex.on_close(self.response_done)
        except Exception:
            log.exception("exchange on_close failed")

    # -- request ---------------------------------------------------------------------

    async def _on_request_headers(self, msg: pb.HttpHeaders) -> Responses:
        self.headers = header_dict(msg.headers)
        if msg.end_of_stream or self.req_mode is BodyMode.NONE:
            d = await self.ex.on_request(self.headers, b"")
            self.request_done = True
            return [r.request_headers(_common(d), _metadata(d))]
        if self.req_mode is BodyMode.FULL_DUPLEX_STREAMED:
            return []  # held until the body is complete
        return [r.request_headers()]  # BUFFERED: the decision rides on the body answer

    async def _on_request_body(self, chunk: pb.HttpBody) -> Responses:
        self.body.add(chunk.body)
        if self.req_mode is BodyMode.FULL_DUPLEX_STREAMED:
            return await self._decide_duplex(True) if chunk.end_of_stream else []
        original = self.body.take()
        d = await self.ex.on_request(self.headers, original)
        if d.body is not None and d.body == original:
            d.body = None
        if d.body is not None:
            d.set_headers["content-length"] = str(len(d.body))
        self.request_done = True
        return [r.request_body(_common(d, with_body=True), _metadata(d))]

    async def _on_request_trailers(self) -> Responses:
        out = []
        if self.req_mode is BodyMode.FULL_DUPLEX_STREAMED:
            out = await self._decide_duplex(False)  # trailers end the body when sent
        out.append(r.request_trailers())
        return out

    async def _decide_duplex(self, end_of_stream: bool) -> Responses:
        """FULL_DUPLEX: the held headers answer, then the (new) body re-chunked."""
        body = self.body.take()
        d = await self.ex.on_request(self.headers, body)
        self.request_done = True
        out = [r.request_headers(_common(d), _metadata(d))]
        out.extend(r.streamed_body(body if d.body is None else d.body, response=False,
                                   end_of_stream=end_of_stream))
        return out

    # -- response --------------------------------------------------------------------

    async def _on_response_headers(self, msg: pb.HttpHeaders) -> Responses:
        decision = self.resp_decision = await self.ex.on_response_headers(
            header_dict(msg.headers))
        eos = msg.end_of_stream
        self.response_started = True
        self.response_done = eos or self.resp_mode is BodyMode.NONE
        streaming = self.resp_mode in (BodyMode.FULL_DUPLEX_STREAMED, BodyMode.STREAMED)
        self.resp_buffered = decision.buffer_body and not eos and streaming
        if not self.resp_buffered:
            return [r.response_headers(_common_headers(decision))]
        if self.resp_mode is BodyMode.FULL_DUPLEX_STREAMED:
            return []  # held until the body is complete
        # STREAMED: the headers leave before the body is known, so let Envoy chunk it.
        decision.remove_headers.append("content-length")
        return [r.response_headers(_common_headers(decision))]

    def _on_response_body(self, chunk: pb.HttpBody) -> Responses:
        out = self._response_body(chunk)
        return self._end_metadata(out) if chunk.end_of_stream else out

    def _end_metadata(self, out: Responses) -> Responses:
        """Attach the exchange's end-of-response metadata to the last answer."""
        if out:
            try:
                metadata = self.ex.response_end_metadata()
            except Exception:
                log.exception("exchange response_end_metadata failed")
                metadata = None
            if metadata:
                out[-1].dynamic_metadata.CopyFrom(r.dynamic_metadata(metadata))
        return out

    def _response_body(self, chunk: pb.HttpBody) -> Responses:
        eos = chunk.end_of_stream
        self.response_done = eos
        if self.resp_buffered:
            self.resp_body.add(chunk.body)
            if self.resp_mode is BodyMode.FULL_DUPLEX_STREAMED:
                return self._flush_duplex_response(True) if eos else []
            # STREAMED: hold every chunk back (clear it), send the whole new body at the end.
            if not eos:
                return [r.response_body(r.common(clear_body=True))]
            new = self.ex.on_response_body(self.resp_body.take())
            return [r.response_body(r.common(body=new))]
        if self.resp_mode is BodyMode.FULL_DUPLEX_STREAMED:
            out = self.ex.on_response_chunk(chunk.body, eos)
            return r.streamed_body(out, response=True, end_of_stream=eos)
        if self.resp_mode is BodyMode.STREAMED:
            out = self.ex.on_response_chunk(chunk.body, eos)
            return [r.response_body(r.common(body=out) if out != chunk.body else None)]
        # BUFFERED: the whole body in one message, the headers not sent yet.
        out = self.ex.on_response_body(chunk.body)
        if out == chunk.body:
            return [r.response_body()]
        return [r.response_body(r.common(body=out, set_headers={"content-length": str(len(out))}))]

    def _on_response_trailers(self) -> Responses:
        self.response_done = True
        out = []
        if self.resp_buffered and self.resp_mode is BodyMode.FULL_DUPLEX_STREAMED:
            out = self._flush_duplex_response(False)
        self.resp_buffered = False
        out.append(r.response_trailers())
        return self._end_metadata(out)

    def _flush_duplex_response(self, end_of_stream: bool) -> Responses:
        """FULL_DUPLEX: the held response headers (length fixed), then the new body."""
        body = self.resp_body.take()
        new = self.ex.on_response_body(body)
        hd = self.resp_decision
        set_headers = hd.set_headers
        if new != body:
            set_headers = {**set_headers, "content-length": str(len(new))}
        out = [r.response_headers(r.common(set_headers=set_headers,
                                           remove_headers=hd.remove_headers))]
        out.extend(r.streamed_body(new, response=True, end_of_stream=end_of_stream))
        return out


def _common(d: RequestDecision, *, with_body: bool = False) -> pb.CommonResponse | None:
    """The decision as a CommonResponse; the body goes in only for BUFFERED (in FULL_DUPLEX
    mode it is re-sent as streamed chunks instead)."""
    body = d.body if with_body else None
    if not (d.set_headers or d.remove_headers or d.clear_route_cache or body is not None):
        return None
    return r.common(
        set_headers=d.set_headers,
        remove_headers=d.remove_headers,
        clear_route_cache=d.clear_route_cache,
        body=body,
    )


def _metadata(d: RequestDecision) -> Any:
    return r.dynamic_metadata(d.metadata) if d.metadata else None


def _common_headers(d: ResponseHeadersDecision) -> pb.CommonResponse | None:
    if not (d.set_headers or d.remove_headers):
        return None
    return r.common(set_headers=d.set_headers, remove_headers=d.remove_headers)
