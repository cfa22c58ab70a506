"""The protobuf wire format and gRPC framing written by hand, for tests that must not trust
the code under test to encode what it decodes (https://protobuf.dev/programming-guides/encoding/)."""

from __future__ import annotations


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def vfield(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def lfield(number: int, value: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(value)) + value


def packed(number: int, values: list[int]) -> bytes:
    return lfield(number, b"".join(varint(v) for v in values))


def frame(message: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(message).to_bytes(4, "big") + message
