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

A service subclasses :class:`Exchange` (one object per HTTP request) and hands a factory to
:class:`ExtProcServicer`. Raising :class:`~shared.errors.GatewayError` from a callback ends
the request with that status and an OpenAI-style JSON body.
"""

from __future__ import annotations

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
from shared.errors import GatewayError, PayloadTooLarge
from shared.headers import header_dict

log = structlog.get_logger(__name__)

_NO_METADATA: Mapping[str, Any] = MappingProxyType({})

#: Default cap on a buffered request body (10 MiB).
DEFAULT_MAX_BODY = 10 * 1024 * 1024


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


@dataclass(slots=True)
class _Body:
    """A body being collected, capped at ``limit`` bytes."""

    limit: int
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise PayloadTooLarge(
                f"request body is larger than the {self.limit}-byte limit",
                code="request_too_large",
            )
        if chunk:
            self.chunks.append(chunk)

    def take(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks.clear()
        return data


@dataclass(slots=True)
class _Progress:
    request_done: bool = False
    response_started: bool = False
    response_done: bool = False


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
    ) -> None:
        self._factory = exchange_factory
        self.request_mode = request_mode
        self.response_mode = response_mode
        self.max_body = max_body

    async def Process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Run one stream; see the module docstring for the protocol."""
        exchange = self._factory()
        # Envoy may reset the stream instead of half-closing it once the response is done,
        # so "completed" is judged by what was seen, not by how the stream ended.
        progress = _Progress()
        try:
            async for resp in self._run(exchange, requests, progress):
                yield resp
                if resp.HasField("immediate_response"):
                    progress.response_done = True
                    return
            # Envoy half-closed: complete if the request was decided and no response was
            # left half-seen (with response processing off, Envoy never shows us one).
            if progress.request_done and not progress.response_started:
                progress.response_done = True
        except GatewayError as e:
            progress.response_done = True
            yield r.immediate_error(e)
        finally:
            try:
                exchange.on_close(progress.response_done)
            except Exception:
                log.exception("exchange on_close failed")

    async def _run(
        self, ex: Exchange, requests: AsyncIterator[pb.ProcessingRequest], progress: _Progress
    ) -> AsyncIterator[pb.ProcessingResponse]:
        req_mode, resp_mode = self.request_mode, self.response_mode
        headers: dict[str, str] = {}
        body = _Body(self.max_body)
        resp_body = _Body(1 << 62)  # responses are the model server's; no cap
        resp_buffered = False
        resp_headers_decision = ResponseHeadersDecision()
        async for msg in requests:
            if msg.HasField("protocol_config"):
                req_mode = BodyMode(msg.protocol_config.request_body_mode)
                resp_mode = BodyMode(msg.protocol_config.response_body_mode)
            if msg.HasField("metadata_context") and ex.filter_metadata is _NO_METADATA:
                ex.filter_metadata = {
                    ns: MessageToDict(st) for ns, st in msg.metadata_context.filter_metadata.items()
                }
            kind = msg.WhichOneof("request")
            if kind == "request_headers":
                headers = header_dict(msg.request_headers.headers)
                if msg.request_headers.end_of_stream or req_mode is BodyMode.NONE:
                    d = await ex.on_request(headers, b"")
                    progress.request_done = True
                    yield r.request_headers(_common(d), _metadata(d))
                elif req_mode is not BodyMode.FULL_DUPLEX_STREAMED:
                    yield r.request_headers()  # the decision rides on the body answer
            elif kind == "request_body":
                chunk = msg.request_body
                body.add(chunk.body)
                if req_mode is BodyMode.FULL_DUPLEX_STREAMED:
                    if chunk.end_of_stream:
                        progress.request_done = True
                        for resp in await self._duplex_request(ex, headers, body.take(), True):
                            yield resp
                else:
                    original = body.take()
                    d = await ex.on_request(headers, original)
                    if d.body is not None and d.body == original:
                        d.body = None
                    if d.body is not None:
                        d.set_headers["content-length"] = str(len(d.body))
                    progress.request_done = True
                    yield r.request_body(_common(d, with_body=True), _metadata(d))
            elif kind == "request_trailers":
                if req_mode is BodyMode.FULL_DUPLEX_STREAMED:
                    # Trailers end the body when the client sent any.
                    progress.request_done = True
                    for resp in await self._duplex_request(ex, headers, body.take(), False):
                        yield resp
                yield r.request_trailers()
            elif kind == "response_headers":
                rh = header_dict(msg.response_headers.headers)
                resp_headers_decision = await ex.on_response_headers(rh)
                eos = msg.response_headers.end_of_stream
                progress.response_started = True
                progress.response_done = eos or resp_mode is BodyMode.NONE
                resp_buffered = resp_headers_decision.buffer_body and not eos and resp_mode in (
                    BodyMode.FULL_DUPLEX_STREAMED, BodyMode.STREAMED)
                if resp_buffered and resp_mode is BodyMode.STREAMED:
                    # The headers leave before the body is known: let Envoy chunk it.
                    resp_headers_decision.remove_headers.append("content-length")
                if not (resp_buffered and resp_mode is BodyMode.FULL_DUPLEX_STREAMED):
                    yield r.response_headers(_common_headers(resp_headers_decision))
            elif kind == "response_body":
                chunk = msg.response_body
                eos = chunk.end_of_stream
                progress.response_done = eos
                if resp_mode is BodyMode.FULL_DUPLEX_STREAMED:
                    if resp_buffered:
                        resp_body.add(chunk.body)
                        if eos:
                            for resp in self._duplex_response(ex, resp_headers_decision,
                                                              resp_body.take(), True):
                                yield resp
                    else:
                        out = ex.on_response_chunk(chunk.body, eos)
                        for resp in r.streamed_body(out, response=True, end_of_stream=eos):
                            yield resp
                elif resp_mode is BodyMode.STREAMED and resp_buffered:
                    # Hold every chunk back (clear it) and send the whole new body at the end.
                    resp_body.add(chunk.body)
                    if eos:
                        yield r.response_body(r.common(body=ex.on_response_body(resp_body.take())))
                    else:
                        yield r.response_body(r.common(clear_body=True))
                elif resp_mode is BodyMode.STREAMED:
                    out = ex.on_response_chunk(chunk.body, eos)
                    yield r.response_body(
                        r.common(body=out) if out != chunk.body else None
                    )
                else:  # BUFFERED: the whole body in one message, headers not yet sent
                    out = ex.on_response_body(chunk.body)
                    if out == chunk.body:
                        yield r.response_body()
                    else:
                        yield r.response_body(r.common(
                            body=out, set_headers={"content-length": str(len(out))}))
            elif kind == "response_trailers":
                progress.response_done = True
                if resp_buffered:
                    for resp in self._duplex_response(ex, resp_headers_decision,
                                                      resp_body.take(), False):
                        yield resp
                    resp_buffered = False
                yield r.response_trailers()

    @staticmethod
    async def _duplex_request(
        ex: Exchange, headers: dict[str, str], body: bytes, end_of_stream: bool
    ) -> list[pb.ProcessingResponse]:
        d = await ex.on_request(headers, body)
        out = [r.request_headers(_common(d), _metadata(d))]
        out.extend(r.streamed_body(body if d.body is None else d.body, response=False,
                                   end_of_stream=end_of_stream))
        return out

    @staticmethod
    def _duplex_response(
        ex: Exchange, hd: ResponseHeadersDecision, body: bytes, end_of_stream: bool
    ) -> list[pb.ProcessingResponse]:
        out_body = ex.on_response_body(body)
        set_headers = hd.set_headers
        if out_body != body:
            set_headers = {**set_headers, "content-length": str(len(out_body))}
        cr = r.common(set_headers=set_headers, remove_headers=hd.remove_headers)
        out = [r.response_headers(cr)]
        out.extend(r.streamed_body(out_body, response=True, end_of_stream=end_of_stream))
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
