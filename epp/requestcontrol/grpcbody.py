"""gRPC request bodies as the EPP sees them: the length-prefixed message framing, and message
classes built at run time from a few field declarations (no generated ``_pb2`` modules, no
``.proto`` files to compile) for the parsers that read gRPC APIs.

A gRPC message on the wire is one frame: 1 byte compressed-flag, 4 bytes big-endian length,
then the serialized protobuf message (https://grpc.io/docs/guides/wire/).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from epp.requestcontrol.response import Usage
from shared.errors import BadRequest

HEADER = 5
_F = descriptor_pb2.FieldDescriptorProto

#: ``(name, number, type, label, type_name, oneof_index)`` of one field; ``type`` is a
#: ``FieldDescriptorProto.TYPE_*``, ``type_name`` the fully-qualified message name or "".
Field = tuple[str, int, int, int, str, int | None]


def field(name: str, number: int, kind: int, *, repeated: bool = False, message: str = "",
          oneof: int | None = None) -> Field:
    """One field declaration for :func:`message_classes`."""
    label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    return (name, number, kind, label, message, oneof)


def message_classes(package: str, messages: dict[str, Sequence[Field]], *,
                    oneofs: dict[str, Sequence[str]] | None = None,
                    ) -> dict[str, type[Message]]:
    """Message classes for ``messages`` (name → fields) in ``package`` (proto3), in a pool of
    their own so they never clash with generated modules of the same names. Fields the
    declarations leave out are kept as unknown fields when a message is read (and written
    back unchanged when it is re-encoded)."""
    fdp = descriptor_pb2.FileDescriptorProto(name=f"{package}.subset.proto", package=package,
                                             syntax="proto3")
    for name, fields in messages.items():
        msg = fdp.message_type.add(name=name)
        for oneof in (oneofs or {}).get(name, ()):
            msg.oneof_decl.add(name=oneof)
        for fname, number, kind, label, type_name, oneof_index in fields:
            f = msg.field.add(name=fname, number=number, type=kind, label=label)
            if type_name:
                f.type_name = "." + type_name
            if oneof_index is not None:
                f.oneof_index = oneof_index
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{package}.{name}")) for name in messages}


def unframe(body: bytes) -> bytes:
    """The one message of a unary gRPC request body, or :class:`BadRequest` saying what is
    wrong with the framing."""
    if len(body) < HEADER:
        raise BadRequest(f"gRPC request body is {len(body)} bytes, shorter than the "
                         f"{HEADER}-byte message header", code="invalid_grpc_frame")
    if body[0] == 1:
        raise BadRequest("compressed gRPC messages are not supported (send them uncompressed)",
                         code="invalid_grpc_frame")
    if body[0] != 0:
        raise BadRequest(f"gRPC message header has compressed-flag {body[0]} (0 or 1 expected)",
                         code="invalid_grpc_frame")
    size = int.from_bytes(body[1:HEADER], "big")
    if len(body) - HEADER != size:
        raise BadRequest(f"gRPC message header says {size} bytes but {len(body) - HEADER} "
                         "follow (a unary request carries exactly one message)",
                         code="invalid_grpc_frame")
    return body[HEADER:]


def frame(message: bytes) -> bytes:
    """``message`` as one uncompressed gRPC frame."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def decode(cls: type[Message], data: bytes, what: str) -> Any:
    """``data`` read as ``cls``, or :class:`BadRequest` naming ``what`` it should have been."""
    msg = cls()
    try:
        msg.ParseFromString(data)
    except DecodeError as e:
        raise BadRequest(f"gRPC message is not a valid {what}: {e}",
                         code="invalid_grpc_message") from None
    return msg


class FrameReader:
    """Whole messages out of a stream of gRPC frames cut anywhere (a response body)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The messages ``chunk`` completes (compressed ones are skipped: nothing to read)."""
        buf = self._buf + chunk if self._buf else chunk
        out = []
        while len(buf) >= HEADER:
            size = int.from_bytes(buf[1:HEADER], "big")
            if len(buf) < HEADER + size:
                break
            if buf[0] == 0:
                out.append(buf[HEADER:HEADER + size])
            buf = buf[HEADER + size:]
        self._buf = buf
        return out


class GrpcResponseReader(ABC):
    """A parser whose API answers in gRPC: it reads token usage out of each response message
    (the exchange passes gRPC response bodies through untouched and feeds it the messages)."""

    @abstractmethod
    def read_response(self, path: str, message: bytes, usage: Usage) -> None:
        """Update ``usage`` from one response message of the request to ``path``; ignore
        what it cannot read (the response is the server's business, not the request's)."""
