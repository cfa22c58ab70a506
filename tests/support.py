"""Test support: a background event loop, small real HTTP backends, in-process services."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Awaitable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import orjson
from aiohttp import web

T = TypeVar("T")


class BackgroundLoop:
    """An asyncio loop in a daemon thread, so sync tests can host async servers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def spawn(self, coro: Awaitable[Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(_wrap(coro), self.loop)

    def close(self) -> None:
        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(_cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _wrap(aw: Awaitable[T]) -> T:
    return await aw


class EchoBackend:
    """A real HTTP server that answers what it received: its name, the body's length and
    hash, and the request headers. ``/sse`` streams ``n`` events ``delay`` seconds apart."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = 0
        self.requests = 0
        self._runner: web.AppRunner | None = None

    async def _echo(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests += 1
        if request.path == "/sse":
            return await self._sse(request)
        payload = {
            "backend": self.name,
            "length": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "method": request.method,
            "path": request.path,
        }
        return web.Response(body=orjson.dumps(payload), content_type="application/json",
                            headers={"x-backend": self.name})

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        n = int(request.query.get("n", "5"))
        delay = float(request.query.get("delay", "0.2"))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream",
                                           "x-backend": self.name})
        await resp.prepare(request)
        for i in range(n):
            await resp.write(f"data: {{\"i\": {i}}}\n\n".encode())
            await asyncio.sleep(delay)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def start(self) -> EchoBackend:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._echo)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class InProcessService:
    """An ext_proc servicer served by :func:`shared.server.serve` on the background loop."""

    def __init__(self, bg: BackgroundLoop, servicer: Any, *, secure: bool = False) -> None:
        from shared.envoy import free_port
        from shared.server import ServeOptions

        self.bg = bg
        self.servicer = servicer
        self.port = free_port()
        self.health_port = free_port()
        self.opts = ServeOptions(grpc_port=self.port, health_port=self.health_port,
                                 secure=secure, host="127.0.0.1", grace=5,
                                 max_message_bytes=32 * 1024 * 1024)
        self._stop: asyncio.Event | None = None
        self._done: Future[Any] | None = None

    def start(self) -> InProcessService:
        from shared.server import serve

        async def make_event() -> asyncio.Event:
            return asyncio.Event()

        self._stop = self.bg.run(make_event())
        self._done = self.bg.spawn(serve(self.servicer, self.opts, stop=self._stop))
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        if self._stop is not None and self._done is not None:
            self.bg.loop.call_soon_threadsafe(self._stop.set)
            self._done.result(10)


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    """Block until something accepts TCP connections on loopback ``port``."""
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on port {port}")
