"""What the Valkey store writes and reads, signed and validated.

Anything that can write to Valkey can put anything there: a replica of another version, an
operator's typo, an attacker. So every value read is decoded here, checked against its exact
shape, and refused with a :class:`Rejected` naming why; the caller counts and logs it and goes
on (one bad value must never end a background task).

With a shared secret (``--state-store-secret-file`` / ``EPP_STATE_STORE_SECRET``) every value
that carries a replica's word — its in-flight counts, a published update, a session — is framed
``<mac>.<payload>`` where ``mac`` is the first 32 hex digits of HMAC-SHA256(secret, ``domain``
NUL ``payload``) and ``domain`` is the key (or channel) the value was written to, so a valid value
cannot be copied under another replica's name. Without a secret the MAC is empty (``.payload``)
and only the shape is checked. In-flight counts also carry their write time and are refused once
older than the in-flight TTL, so a replayed or never-expiring value stops counting.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from typing import Any

import orjson

#: Block hashes are the low 64 bits of the engine's hash.
MAX_HASH = (1 << 64) - 1
#: Bounds a reader accepts; a value over them is refused, not trimmed.
MAX_ENDPOINTS = 10_000
MAX_COUNT = 1 << 31
MAX_TEXT = 512
#: Clock skew allowed between replicas, seconds, on top of the in-flight TTL.
CLOCK_SKEW = 2.0


class Rejected(ValueError):
    """A value read from the store that is refused; ``reason`` is a short metric label."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Codec:
    """Frames and checks the store's values for one shared ``secret`` (None: unsigned)."""

    secret: bytes | None = None

    def _mac(self, domain: str, payload: bytes) -> bytes:
        if self.secret is None:
            return b""
        digest = hmac.new(self.secret, domain.encode() + b"\0" + payload, hashlib.sha256)
        return digest.hexdigest()[:32].encode()

    def seal(self, domain: str, payload: bytes) -> bytes:
        """``payload`` framed with its MAC for ``domain``."""
        return self._mac(domain, payload) + b"." + payload

    def open(self, domain: str, data: bytes) -> bytes:
        """The payload of a sealed value, or :class:`Rejected`."""
        if not isinstance(data, bytes):
            raise Rejected("type", type(data).__name__)
        mac, dot, payload = data.partition(b".")
        if not dot:
            raise Rejected("unframed")
        if not hmac.compare_digest(mac, self._mac(domain, payload)):
            raise Rejected("signature")
        return payload

    # --- in-flight counts ---------------------------------------------------------------
    def seal_inflight(self, domain: str, counts: dict[str, list[int]]) -> bytes:
        """This replica's counts with the write time."""
        return self.seal(domain, orjson.dumps({"t": time.time(), "c": counts}))

    def open_inflight(self, domain: str, data: bytes, max_age: float) -> dict[str, list[int]]:
        """Another replica's counts: ``{endpoint: [requests, tokens]}``, checked."""
        value = _json(self.open(domain, data))
        if not isinstance(value, dict) or set(value) != {"t", "c"}:
            raise Rejected("shape", "in-flight value is not {t, c}")
        written, counts = value["t"], value["c"]
        if not _number(written):
            raise Rejected("shape", "in-flight time is not a number")
        if abs(time.time() - written) > max_age + CLOCK_SKEW:
            raise Rejected("stale", f"written {time.time() - written:.1f}s ago")
        if not isinstance(counts, dict) or len(counts) > MAX_ENDPOINTS:
            raise Rejected("shape", "in-flight counts are not a bounded map")
        for endpoint, pair in counts.items():
            _text(endpoint)
            if (not isinstance(pair, list) or len(pair) != 2
                    or not all(_count(n) for n in pair)):
                raise Rejected("shape", "in-flight count is not [requests, tokens]")
        return counts

    # --- the update feed ----------------------------------------------------------------
    def open_update(self, domain: str, data: bytes) -> dict[str, Any]:
        """A published update, checked: ``{"r", "p": [[ep, [hash...], cap]...], "s"}``."""
        update = _json(self.open(domain, data))
        if not isinstance(update, dict) or not set(update) <= {"r", "p", "s"}:
            raise Rejected("shape", "update is not {r, p, s}")
        _text(update.get("r"))
        writes = update.get("p", [])
        if not isinstance(writes, list):
            raise Rejected("shape", "update p is not a list")
        checked = []
        for write in writes:
            if not isinstance(write, list) or len(write) != 3:
                raise Rejected("shape", "prefix write is not [endpoint, hashes, capacity]")
            endpoint, hashes, capacity = write
            _text(endpoint)
            if not isinstance(hashes, list) or not _count(capacity):
                raise Rejected("shape", "prefix write hashes/capacity")
            checked.append((endpoint, [parse_hash(h) for h in hashes], capacity))
        sessions = update.get("s", {})
        if not isinstance(sessions, dict):
            raise Rejected("shape", "update s is not a map")
        for key, value in sessions.items():
            _text(key)
            _text(value)
        return {"r": update["r"], "p": checked,
                "s": {k: self.session_value(k, v) for k, v in sessions.items()}}

    # --- sessions -----------------------------------------------------------------------
    def seal_session(self, key: str, value: str) -> str:
        """A session value as stored (and published)."""
        return self.seal("session:" + key, value.encode()).decode()

    def session_value(self, key: str, stored: str | bytes) -> str:
        """The value of a stored session, checked."""
        raw = stored if isinstance(stored, bytes) else stored.encode()
        try:
            return self.open("session:" + key, raw).decode()
        except UnicodeDecodeError:
            raise Rejected("encoding") from None


def parse_hash(raw: object) -> int:
    """A block hash as stored (decimal string or bytes), checked to fit 64 bits."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            raise Rejected("encoding", "block hash") from None
    if not isinstance(raw, str) or not raw.isdigit() or len(raw) > 20:
        raise Rejected("shape", "block hash is not a decimal integer")
    value = int(raw)
    if value > MAX_HASH:
        raise Rejected("shape", "block hash over 64 bits")
    return value


def decode_name(raw: bytes) -> str:
    """A replica or endpoint name read from a set, checked."""
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Rejected("encoding", "name") from None
    _text(name)
    return name


def _json(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise Rejected("json") from None


def _text(value: object) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise Rejected("shape", "expected a short non-empty string")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT
