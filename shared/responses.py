"""Builders for ext_proc ``ProcessingResponse`` messages.

Kept as plain functions over the generated protobuf classes (``xds-protos``) so the hot path
allocates only what it sends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from shared.errors import DirectResponse, GatewayError

#: Envoy forwards a streamed body chunk as one gRPC message; Envoy's own limit on a
#: streamed chunk is 64 KiB, so re-sent bodies are cut below it.
MAX_CHUNK = 62_000

#: Namespace Envoy's load balancers read per-request routing hints from.
LB_NAMESPACE = "envoy.lb"

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_mutation(
    set_headers: Mapping[str, str] | None = None, remove: Iterable[str] = ()
) -> pb.HeaderMutation:
    """Set (overwriting) and remove request or response headers."""
    mutation = pb.HeaderMutation()
    if set_headers:
        for key, value in set_headers.items():
            mutation.set_headers.append(
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
                    append_action=_OVERWRITE,
                )
            )
    mutation.remove_headers.extend(remove)
    return mutation


def common(
    *,
    set_headers: Mapping[str, str] | None = None,
    remove_headers: Iterable[str] = (),
    clear_route_cache: bool = False,
    body: bytes | None = None,
    clear_body: bool = False,
) -> pb.CommonResponse:
    """A ``CommonResponse``; ``body`` replaces the whole buffered body (or one streamed chunk),
    ``clear_body`` drops it."""
    resp = pb.CommonResponse(clear_route_cache=clear_route_cache)
    if set_headers or remove_headers:
        resp.header_mutation.CopyFrom(header_mutation(set_headers, remove_headers))
    if body is not None:
        resp.body_mutation.body = body
    elif clear_body:
        resp.body_mutation.clear_body = True
    return resp


def dynamic_metadata(metadata: Mapping[str, Mapping[str, Any]]) -> struct_pb2.Struct:
    """``{namespace: {key: value}}`` → the Struct Envoy stores as dynamic metadata."""
    s = struct_pb2.Struct()
    s.update({ns: dict(values) for ns, values in metadata.items()})
    return s


def request_headers(
    cr: pb.CommonResponse | None = None, metadata: struct_pb2.Struct | None = None
) -> pb.ProcessingResponse:
    """Answer to ``request_headers``."""
    resp = pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=cr))
    if metadata is not None:
        resp.dynamic_metadata.CopyFrom(metadata)
    return resp


def response_headers(cr: pb.CommonResponse | None = None) -> pb.ProcessingResponse:
    """Answer to ``response_headers``."""
    return pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=cr))


def request_body(
    cr: pb.CommonResponse | None = None, metadata: struct_pb2.Struct | None = None
) -> pb.ProcessingResponse:
    """Answer to a buffered or (non-duplex) streamed ``request_body``."""
    resp = pb.ProcessingResponse(request_body=pb.BodyResponse(response=cr))
    if metadata is not None:
        resp.dynamic_metadata.CopyFrom(metadata)
    return resp


def response_body(cr: pb.CommonResponse | None = None) -> pb.ProcessingResponse:
    """Answer to a buffered or (non-duplex) streamed ``response_body``."""
    return pb.ProcessingResponse(response_body=pb.BodyResponse(response=cr))


def request_trailers() -> pb.ProcessingResponse:
    """Answer to ``request_trailers`` (no mutation)."""
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def response_trailers() -> pb.ProcessingResponse:
    """Answer to ``response_trailers`` (no mutation)."""
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def streamed_body(
    body: bytes, *, response: bool, end_of_stream: bool = True
) -> list[pb.ProcessingResponse]:
    """A body re-sent in FULL_DUPLEX_STREAMED mode as chunks of at most :data:`MAX_CHUNK` bytes.

    An empty body still gives one (empty) chunk so that ``end_of_stream`` reaches Envoy. Built
    as one nested constructor per chunk: this runs for every streamed token.
    """
    n = len(body)
    last = (n - 1) // MAX_CHUNK * MAX_CHUNK if n else 0
    out = []
    for off in range(0, max(n, 1), MAX_CHUNK):
        chunk = pb.StreamedBodyResponse(body=body[off:off + MAX_CHUNK],
                                        end_of_stream=end_of_stream and off == last)
        answer = pb.BodyResponse(response=pb.CommonResponse(
            body_mutation=pb.BodyMutation(streamed_response=chunk)))
        out.append(pb.ProcessingResponse(response_body=answer) if response
                   else pb.ProcessingResponse(request_body=answer))
    return out


def immediate(
    status: int,
    body: bytes,
    *,
    content_type: str = "application/json",
    details: str = "",
    headers: Mapping[str, str] | None = None,
) -> pb.ProcessingResponse:
    """Ends the request at Envoy with ``status`` and ``body``; nothing goes upstream."""
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=header_mutation({"content-type": content_type, **(headers or {})}),
            body=body,
            details=details,
        )
    )


def immediate_error(err: GatewayError) -> pb.ProcessingResponse:
    """The one place a :class:`GatewayError` becomes what the client sees; an error with a
    ``retry_after`` (seconds, e.g. flow control's 429/503) also sends ``retry-after``, and one
    with ``extra_headers`` (e.g. flow control's ``x-llm-d-request-dropped-reason``) those."""
    if isinstance(err, DirectResponse):
        return immediate(err.status, err.payload, details=err.code)
    retry_after: int | None = getattr(err, "retry_after", None)
    headers: dict[str, str] | None = dict(getattr(err, "extra_headers", None) or {}) or None
    if retry_after is not None:
        headers = {**(headers or {}), "retry-after": str(retry_after)}
    return immediate(err.status, orjson.dumps(err.to_json()), details=err.code, headers=headers)
