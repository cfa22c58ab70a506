"""OTLP's ``ExportTraceServiceRequest`` written straight to protobuf wire bytes.

The SDK's encoder builds a protobuf object per span, attribute and value in Python: ~40 µs of
CPU per span here, which at upstream's 10% sampling was most of what tracing cost the EPP.
Our spans repeat the same keys and many of the same values (plugin names, endpoints), so
their encodings are cached and a span is mostly a join of ready bytes (bench/RESULTS.md has
the figures). The result is parsed back into the real message (in C) by
:class:`FastOTLPSpanExporter`, so everything else - endpoint, TLS, headers, retries - is the
SDK exporter's own. Fields (opentelemetry/proto/trace/v1/trace.proto): span 1 trace_id,
2 span_id, 4 parent_span_id, 5 name, 6 kind, 7/8 start/end (fixed64), 9 attributes,
15 status; events and links are not written (no span of ours has any).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
#: Encoded keys and short string values are kept (a bounded number: request ids never repeat).
_CACHE_LIMIT = 8192
_keys: dict[str, bytes] = {}
_strings: dict[str, bytes] = {}


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _string_value(v: str) -> bytes:
    """AnyValue{string_value}, cached for values that repeat."""
    found = _strings.get(v)
    if found is None:
        found = _ld(1, v.encode())
        if len(_strings) < _CACHE_LIMIT and len(v) <= 256:
            _strings[v] = found
    return found


def any_value(v: Any) -> bytes:
    """The AnyValue message body for an attribute value."""
    if isinstance(v, str):
        return _string_value(v)
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, int):
        return b"\x18" + _varint(v & 0xFFFF_FFFF_FFFF_FFFF)
    if isinstance(v, float):
        return b"\x21" + _pack_double(v)
    if isinstance(v, bytes):
        return _ld(7, v)
    if isinstance(v, Sequence):
        return _ld(5, b"".join([_ld(1, any_value(x)) for x in v]))
    return _string_value(str(v))


def attributes(attrs: Mapping[str, Any] | None, field: int) -> bytes:
    """Repeated KeyValue ``field``."""
    if not attrs:
        return b""
    parts = []
    keys = _keys
    for k, v in attrs.items():
        key = keys.get(k)
        if key is None:
            key = _ld(1, k.encode())
            if len(keys) < _CACHE_LIMIT:
                keys[k] = key
        parts.append(_ld(field, key + _ld(2, any_value(v))))
    return b"".join(parts)


def span(s: Any) -> bytes:
    """One SDK ``ReadableSpan`` as a Span message body."""
    ctx = s.context
    out = [_ld(1, ctx.trace_id.to_bytes(16, "big")), _ld(2, ctx.span_id.to_bytes(8, "big"))]
    if s.parent is not None:
        out.append(_ld(4, s.parent.span_id.to_bytes(8, "big")))
    out.append(_ld(5, s.name.encode()))
    out.append(b"\x30" + _varint(s.kind.value + 1))  # API INTERNAL=0 ... proto INTERNAL=1
    out.append(b"\x39" + _pack_fixed64(s.start_time or 0))
    out.append(b"\x41" + _pack_fixed64(s.end_time or 0))
    out.append(attributes(s.attributes, 9))
    status = s.status
    if status is not None and status.status_code.value:
        body = b"\x18" + _varint(status.status_code.value)
        if status.description:
            body = _ld(2, status.description.encode()) + body
        out.append(_ld(15, body))
    return b"".join(out)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    out = _ld(1, (scope.name or "").encode())
    if scope.version:
        out += _ld(2, scope.version.encode())
    return out


def export_request(spans: Iterable[Any]) -> bytes:
    """ExportTraceServiceRequest bytes: spans grouped by resource, then by scope."""
    groups: dict[int, tuple[Any, dict[Any, tuple[Any, list[bytes]]]]] = {}
    for s in spans:
        resource = s.resource
        _, scopes = groups.setdefault(id(resource), (resource, {}))
        scope = s.instrumentation_scope
        key = (scope.name, scope.version) if scope is not None else None
        scopes.setdefault(key, (scope, []))[1].append(_ld(2, span(s)))
    out = []
    for resource, scopes in groups.values():
        body = [_ld(1, attributes(resource.attributes, 1))]
        for scope, encoded in scopes.values():
            body.append(_ld(2, _ld(1, _scope(scope)) + b"".join(encoded)))
        out.append(_ld(1, b"".join(body)))
    return b"".join(out)


def fast_exporter_class() -> type:
    """The SDK's OTLP/gRPC exporter with :func:`export_request` as its encoder (imported on
    demand: only a process with tracing on loads the exporter)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    class FastOTLPSpanExporter(OTLPSpanExporter):
        """OTLP/gRPC export whose request is encoded by :func:`export_request`."""

        def _translate_data(self, data: Sequence[Any]) -> ExportTraceServiceRequest:
            return ExportTraceServiceRequest.FromString(export_request(data))

    return FastOTLPSpanExporter
