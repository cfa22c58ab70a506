"""OTLP's ``ExportTraceServiceRequest`` written straight to protobuf wire bytes.

The SDK's encoder builds a protobuf object per span, attribute and value in Python: ~40 µs of
CPU per span here, which at upstream's 10% sampling was most of what tracing cost the EPP.
Our spans repeat the same keys and many of the same values (plugin names, endpoints), so
their encodings are cached and a span is mostly a join of ready bytes (~9 µs; bench/RESULTS.md
has the figures). :class:`FastOTLPSpanExporter` sends those bytes as the gRPC request as they
are; everything else - endpoint, TLS, headers, retries - is the SDK exporter's own. Fields
(opentelemetry/proto/trace/v1/trace.proto): span 1 trace_id, 2 span_id, 4 parent_span_id,
5 name, 6 kind, 7/8 start/end (fixed64), 9 attributes, 15 status; events and links are not
written (no span of ours has any).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
#: Encoded keys, short strings and whole attributes of repeated values are kept; a cache is
#: emptied when it reaches this size (request ids never repeat; plugin names always do).
_CACHE_LIMIT = 8192
_keys: dict[str, bytes] = {}
_strings: dict[str, bytes] = {}
#: KeyValue encodings by (field, key, type, value), for str/int/bool values (the type is in
#: the key: True == 1 would otherwise share an entry).
_pairs: dict[tuple[int, str, type, Any], bytes] = {}


def _varint_slow(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


#: Every varint below 2**14 (lengths of nearly everything a span holds), ready-made.
_SMALL = [_varint_slow(n) for n in range(1 << 14)]


def _varint(n: int) -> bytes:
    return _SMALL[n] if n < 16384 else _varint_slow(n)


def _tag(field: int) -> bytes:
    return _varint(field << 3 | 2)


_TAGS = [_tag(f) for f in range(16)]


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    n = len(payload)
    return _TAGS[field] + (_SMALL[n] if n < 16384 else _varint_slow(n)) + payload


def _string_value(v: str) -> bytes:
    """AnyValue{string_value}, cached for values that repeat."""
    found = _strings.get(v)
    if found is None:
        found = _ld(1, v.encode())
        if len(v) <= 256:
            if len(_strings) >= _CACHE_LIMIT:
                _strings.clear()
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


def _key(k: str) -> bytes:
    key = _keys.get(k)
    if key is None:
        key = _ld(1, k.encode())
        if len(_keys) >= _CACHE_LIMIT:
            _keys.clear()
        _keys[k] = key
    return key


def attributes(attrs: Mapping[str, Any] | None, field: int) -> bytes:
    """Repeated KeyValue ``field``."""
    if not attrs:
        return b""
    parts = []
    pairs = _pairs
    for k, v in attrs.items():
        cls = v.__class__
        if cls is str or cls is int or cls is bool:
            cached = pairs.get((field, k, cls, v))
            if cached is None:
                cached = _ld(field, _key(k) + _ld(2, any_value(v)))
                if len(pairs) >= _CACHE_LIMIT:
                    pairs.clear()
                pairs[(field, k, cls, v)] = cached
            parts.append(cached)
        else:
            parts.append(_ld(field, _key(k) + _ld(2, any_value(v))))
    return b"".join(parts)


def span(s: Any) -> bytes:
    """One span (an SDK ``ReadableSpan`` or our own) as a Span message body."""
    ctx = s.context
    parent = s.parent
    status = s.status
    code = status.status_code.value if status is not None else 0
    out = [b"\x0a\x10", ctx.trace_id.to_bytes(16, "big"),
           b"\x12\x08", ctx.span_id.to_bytes(8, "big")]
    if parent is not None:
        out += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    out += (_ld(5, s.name.encode()),
            b"\x30", _SMALL[s.kind.value + 1],  # API INTERNAL=0 ... proto INTERNAL=1
            b"\x39", _pack_fixed64(s.start_time or 0),
            b"\x41", _pack_fixed64(s.end_time or 0),
            attributes(s.attributes, 9))
    if code:
        body = b"\x18" + _varint(code)
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
    """The SDK's OTLP/gRPC exporter sending :func:`export_request`'s bytes as they are
    (imported on demand: only a process with tracing on loads the exporter)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    class _WireStub:
        """``TraceService`` whose ``Export`` takes the request's wire bytes: no message is
        built from them only to be serialized again (~9 µs a span, measured here)."""

        def __init__(self, channel: Any) -> None:
            self.Export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=None,
                response_deserializer=ExportTraceServiceResponse.FromString)

    class FastOTLPSpanExporter(OTLPSpanExporter):
        """OTLP/gRPC export whose request is written by :func:`export_request`; endpoint,
        TLS, headers, compression, timeouts and retries stay the SDK exporter's."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # The SDK builds its client from ``_stub`` (here and on reconnecting).
            self._stub = _WireStub
            self._client = _WireStub(self._channel)  # type: ignore[assignment]

        def _translate_data(self, data: Sequence[Any]) -> Any:
            return export_request(data)

    return FastOTLPSpanExporter
