"""Hostile slow clients and the legitimate traffic next to them (issue 31, item 1).

A slow client opens a connection, sends a request's headers and half its body, then stalls:
the gateway holds a BBR stream for it until a timeout sheds it. :func:`open_slow` opens many
(plain sockets, nothing read); :func:`replies` reads what the gateway finally answered them;
:func:`legit_requests` sends ordinary requests meanwhile and classifies every answer.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import orjson


def open_slow(port: int, n: int, *, model: str, path: str = "/v1/completions",
              body_bytes: int = 2000) -> list[socket.socket]:
    """``n`` connections that each sent headers and half of a ``body_bytes`` body."""
    head = (f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            f"Content-Length: {body_bytes}\r\n\r\n").encode()
    half = b'{"model": "' + model.encode() + b'", "prompt": "' + b"x" * (body_bytes // 2)
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(head + half)
        out.append(s)
    return out


def replies(socks: list[socket.socket], timeout: float) -> Counter[str]:
    """What each slow client was finally answered: ``"<status> json"``, ``"<status> bare"``
    or ``"none"`` (still held, or closed without a reply). Closes the sockets."""
    seen: Counter[str] = Counter()
    for s in socks:
        s.settimeout(timeout)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except OSError:
            pass  # a timeout: still held
        finally:
            s.close()
        seen[classify_raw(data)] += 1
    return seen


def classify_raw(data: bytes) -> str:
    """``"<status> json"`` when the body is an OpenAI error object, else ``"<status> bare"``."""
    if not data.startswith(b"HTTP/1.1 "):
        return "none"
    status = data[9:12].decode()
    body = data.partition(b"\r\n\r\n")[2]
    return f"{status} {'json' if is_openai_error(body) else 'bare'}"


def is_openai_error(body: bytes) -> bool:
    """True for ``{"error": {"message", "type", "code"}}``."""
    try:
        err = orjson.loads(body)["error"]
        return all(k in err for k in ("message", "type", "code"))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return False


@dataclass
class Outcome:
    """Statuses of legitimate requests: ``"200"``, ``"<status> json"``, ``"<status> bare"``,
    ``"error"`` (the connection failed)."""

    counts: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> int:
        return self.counts["200"]

    @property
    def bare(self) -> int:
        """Refusals that are not OpenAI-shaped (the bug: a bare 500)."""
        return sum(n for k, n in self.counts.items() if k.endswith("bare") or k == "error")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


async def legit_requests(url: str, n: int, concurrency: int, *, model: str,
                         stream: bool = False, timeout: float = 60) -> Outcome:
    """``n`` ordinary completions, ``concurrency`` at a time; every answer classified."""
    out = Outcome()
    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as session:

        async def one(i: int) -> None:
            body = {"model": model, "prompt": f"request {i}", "max_tokens": 4, "stream": stream}
            async with sem:
                try:
                    async with session.post(url, json=body) as r:
                        data = await r.read()
                        if r.status == 200:
                            out.counts["200"] += 1
                        else:
                            shape = "json" if is_openai_error(data) else "bare"
                            out.counts[f"{r.status} {shape}"] += 1
                except (aiohttp.ClientError, TimeoutError):
                    out.counts["error"] += 1

        await asyncio.gather(*(one(i) for i in range(n)))
    return out
