"""One HTTP exchange through the EPP: the director decides the request, the response is
rewritten back to the client's model and its usage is recorded when the stream ends."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from epp import telemetry as m
from epp.flowcontrol.controller import FlowController
from epp.requestcontrol import Director, Routed
from epp.requestcontrol.grpcbody import FrameReader, GrpcResponseReader
from epp.requestcontrol.response import ResponseRewriter, Usage
from shared import tracing
from shared.errors import GatewayError, for_path
from shared.extproc import Exchange, RequestDecision, ResponseHeadersDecision

if TYPE_CHECKING:
    from shared.tracing import ChildSpan


class PickerExchange(Exchange):
    """Created per stream by :class:`shared.extproc.ExtProcServicer`."""

    def __init__(self, director: Director) -> None:
        self.director = director
        self.routed: Routed | None = None
        self.rewriter: ResponseRewriter | None = None
        self.status = 0
        self.response_size = 0
        self.grpc: _GrpcUsage | None = None
        #: The flow controller tracking this exchange for eviction, if any.
        self._tracked: FlowController | None = None
        #: ``llm_d_epp_response_processing_duration_seconds``: our time on this response
        #: (streamed: the sum of per-chunk slices, so generation time between chunks is
        #: left out; otherwise headers to end). None until the response headers arrive.
        self.response_processing: float | None = None
        self.response_started = 0.0
        self.sse = False
        #: The request's trace when tracing is on and the request sampled (else None).
        self.trace: tracing.RequestTrace | None = None
        self.response_span: ChildSpan | None = None

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestDecision:
        director = self.director
        started = time.perf_counter()
        if tracing.TRACER is not None:
            self.trace = tracing.start_request("gateway.request", headers,
                                               self.grpc_traceparent)
        try:
            pending = director.prepare(headers, body, self.filter_metadata, self.trace)
            if director.runtime.admitters:
                await director.admit(pending)
            decision, self.routed = director.dispatch(pending)
        except GatewayError as e:
            for_path(e, headers.get(":path", ""))
            self.director.count_error(headers, e)
            if self.trace is not None:
                self.trace.fail(self.trace.root, e)
            raise
        finally:  # refusals too: a queue's rejections are the slowest samples (as upstream)
            m.REQUEST_PROCESSING.observe(time.perf_counter() - started)
        # A request that named no model gets the response's model unchanged (as upstream).
        self.rewriter = ResponseRewriter(self.routed.client_model or self.routed.target_model,
                                         self.routed.target_model)
        fc = director.runtime.flow_control
        if fc is not None and fc.reclamation is not None \
                and fc.reclamation.evictor.evictable(self.routed.request.priority):
            self._evictable(fc)
        return decision

    def _evictable(self, fc: FlowController) -> None:
        """With in-flight eviction: let flow control end this exchange with a 429."""
        assert self.routed is not None
        request = self.routed.request
        interrupt: asyncio.Future[GatewayError] = asyncio.get_running_loop().create_future()

        def evict(err: GatewayError) -> None:
            if not interrupt.done():
                interrupt.set_result(err)

        if fc.track_inflight(request.request_id, request.priority, evict):
            self.interrupt = interrupt
            self._tracked = fc

    async def on_response_headers(self, headers: dict[str, str]) -> ResponseHeadersDecision:
        started = self.response_started = time.perf_counter()
        try:
            return self._response_headers(headers)
        finally:
            self.response_processing = time.perf_counter() - started

    def _response_headers(self, headers: dict[str, str]) -> ResponseHeadersDecision:
        try:
            self.status = int(headers.get(":status", "200"))
        except ValueError:
            self.status = 0
        added: dict[str, str] = {}
        if self.trace is not None:
            self.response_span = self.trace.span("response", {
                "http.response.status_code": self.status})
        if self.routed is not None:
            added = self.director.response_received(self.routed, self.status or 200, headers,
                                                    self.response_metadata)
        content_type = headers.get("content-type", "")
        if content_type.startswith("application/grpc") and self.routed is not None:
            # Protobuf frames, never JSON: passed on untouched (a gRPC stream must not wait
            # for its end), usage read by the parser when it knows the API.
            parser = self.director.runtime.parser
            self.rewriter = None
            if isinstance(parser, GrpcResponseReader):
                self.grpc = _GrpcUsage(parser, self.routed.request.headers.get(":path", ""))
            return ResponseHeadersDecision(set_headers=dict(added))
        sse = self.sse = content_type.startswith("text/event-stream")
        return ResponseHeadersDecision(set_headers=dict(added),
                                       buffer_body=not sse and self.rewriter is not None)

    def on_response_chunk(self, chunk: bytes, end_of_stream: bool) -> bytes:
        if not self.sse:
            return self._response_chunk(chunk, end_of_stream)
        started = time.perf_counter()
        try:
            return self._response_chunk(chunk, end_of_stream)
        finally:
            if self.response_processing is not None:
                self.response_processing += time.perf_counter() - started

    def _response_chunk(self, chunk: bytes, end_of_stream: bool) -> bytes:
        self.response_size += len(chunk)
        if self.grpc is not None:
            if self.grpc.feed(chunk) and self.routed is not None:
                self.director.response_chunk(self.routed, chunk, True)
            return chunk
        if self.rewriter is None:
            return chunk
        out = self.rewriter.chunk(chunk, end_of_stream)
        if self.routed is not None and (self.routed.response.ttft is None
                                        or self.director.runtime.response_streaming):
            self.director.response_chunk(self.routed, chunk, self.rewriter.first_token_seen)
        return out

    def on_response_body(self, body: bytes) -> bytes:
        self.response_size += len(body)
        if self.grpc is not None:
            self.grpc.feed(body)
        if self.rewriter is None:
            return body
        return self.rewriter.body(body)

    def response_end_metadata(self) -> dict[str, dict[str, Any]] | None:
        if self.routed is None or not self.director.runtime.response_metadata:
            return None
        usage = self.rewriter.usage.raw if self.rewriter is not None else None
        return self.director.response_metadata(self.routed, usage)

    def on_close(self, completed: bool) -> None:
        if self._tracked is not None and self.routed is not None:
            self._tracked.untrack_inflight(self.routed.request.request_id)
            self._tracked = None
        if self.response_processing is not None:  # aborted streams too (as upstream)
            m.RESPONSE_PROCESSING.observe(
                self.response_processing if self.sse
                else time.perf_counter() - self.response_started)
            self.response_processing = None
        routed = self.routed
        if routed is None:
            if self.trace is not None:
                self._end_trace(None, completed)
            return
        usage = self.rewriter.usage if self.rewriter is not None else None
        if self.grpc is not None:
            usage = self.grpc.usage
        prompt_tokens = usage.prompt_tokens if usage else 0
        if usage is not None and usage.raw is None and usage.completion_tokens \
                and routed.request.prompt_token_ids is not None and self.grpc is None:
            # Generated ids counted but no usage in the answer (vLLM's /inference/v1/generate):
            # the request's own token ids are the exact prompt count.
            prompt_tokens = len(routed.request.prompt_token_ids)
        self.director.finish(
            routed, completed=completed, status=self.status or 200,
            response_size=self.response_size,
            prompt_tokens=prompt_tokens,
            completion_tokens=usage.completion_tokens if usage else 0,
            cached_tokens=usage.cached_tokens if usage else 0,
        )
        self.routed = None
        if self.trace is not None:
            self._end_trace(routed, completed)

    def _end_trace(self, routed: Routed | None, completed: bool) -> None:
        """The GenAI attributes of what was served, then the response and root spans end."""
        trace = self.trace
        assert trace is not None
        self.trace = None
        root = trace.root
        if routed is not None:
            r = routed.response
            attrs: dict[str, Any] = {
                "gen_ai.response.model": routed.target_model,
                "gen_ai.usage.input_tokens": r.prompt_tokens,
                "gen_ai.usage.output_tokens": r.completion_tokens,
                "http.response.status_code": r.status,
                "http.response.body.size": r.size,
                "llm_d.epp.response.completed": completed,
            }
            if r.cached_tokens:
                attrs["gen_ai.usage.cached_tokens"] = r.cached_tokens
            if r.ttft is not None:
                attrs["gen_ai.server.time_to_first_token"] = r.ttft
            if r.tpot is not None:
                attrs["gen_ai.server.time_per_output_token"] = r.tpot
            root.set_attributes(attrs)
            if self.response_span is not None:
                self.response_span.set_attributes(attrs)
        if self.response_span is not None:
            self.response_span.end()
            self.response_span = None
        root.end()


class _GrpcUsage:
    """Reads usage from a gRPC response's messages as they pass."""

    __slots__ = ("frames", "parser", "path", "usage")

    def __init__(self, parser: GrpcResponseReader, path: str) -> None:
        self.parser, self.path = parser, path
        self.frames = FrameReader()
        self.usage = Usage()

    def feed(self, chunk: bytes) -> bool:
        """True when ``chunk`` completed at least one message."""
        messages = self.frames.feed(chunk)
        for message in messages:
            self.parser.read_response(self.path, message, self.usage)
        return bool(messages)
