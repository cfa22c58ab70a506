"""Test support: a background event loop, small real HTTP backends, in-process services.

``pool_manifests``/``write_yaml`` live in :mod:`devkit.manifests` (benchmarks use them too).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import orjson
from aiohttp import web

from devkit.envoy import wait_for_port

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


class _AppServer:
    """A real aiohttp server on ``host:port`` (0 = a free port), started in the caller's loop."""

    host = "127.0.0.1"
    port = 0
    _runner: web.AppRunner | None = None

    async def _serve(self, app: web.Application) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class EchoBackend(_AppServer):
    """A real HTTP server that answers what it received: its name, the body's length and
    hash, and the request headers. ``/sse`` streams ``n`` events ``delay`` seconds apart."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests = 0

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
        await self._serve(app)
        return self


class InProcessService:
    """An ext_proc servicer served by :func:`shared.server.serve` on the background loop."""

    def __init__(self, bg: BackgroundLoop, servicer: Any, *, secure: bool = False) -> None:
        from devkit.envoy import free_port
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


class FakeModelServer(_AppServer):
    """A small real OpenAI-style server whose vLLM ``/metrics`` the test sets directly.

    Answers completions and chat with ``model`` echoed back, ``usage``, the request headers
    and ``x-inference-pod``/``x-inference-port``; ``"stream": true`` gets SSE events
    ``delay`` seconds apart. ``metrics_status`` != 200 makes scrapes fail. With ``hold`` on,
    each request waits until the test raises ``released`` past its arrival index, and the
    held ones count in the scraped waiting queue (so one request at a time saturates).
    """

    def __init__(self, name: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.waiting = 0
        self.running = 0
        self.kv = 0.0
        self.max_lora = 4
        self.running_loras: list[str] = []
        self.waiting_loras: list[str] = []
        self.model = "base-model"
        self.metrics_status = 200
        self.stream_delay = 0.05
        #: How response JSON is written (one line per SSE event); compact, as vLLM writes it.
        self.dumps: Callable[[Any], bytes] = orjson.dumps
        self.requests: list[dict[str, Any]] = []
        self.hold = False
        self.held = 0
        self.released = 0

    @property
    def key(self) -> str:
        return f"{self.host}:{self.port}"

    def metrics_text(self) -> str:
        labels = f'model_name="{self.model}"'
        lora = (f'vllm:lora_requests_info{{max_lora="{self.max_lora}",'
                f'running_lora_adapters="{",".join(self.running_loras)}",'
                f'waiting_lora_adapters="{",".join(self.waiting_loras)}"}} 1.7e9\n')
        return (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} {self.waiting + self.held}\n"
            f"vllm:num_requests_running{{{labels}}} {self.running}\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} {self.kv}\n" + lora
        )

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text(), status=self.metrics_status)

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append({"body": body, "headers": headers})
        if self.hold:
            arrival = len(self.requests) - 1
            self.held += 1
            while self.released <= arrival:
                await asyncio.sleep(0.01)
            self.held -= 1
        who = {"x-inference-pod": self.name, "x-inference-port": str(self.port)}
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        if body.get("stream"):
            resp = web.StreamResponse(headers={"content-type": "text/event-stream", **who})
            await resp.prepare(request)
            for i in range(3):
                event = {"id": "x", "model": body["model"],
                         "choices": [{"index": 0, "text": f"t{i}"}]}
                await resp.write(b"data: " + self.dumps(event) + b"\n\n")
                await asyncio.sleep(self.stream_delay)
            final = {"id": "x", "model": body["model"], "choices": [], "usage": usage}
            await resp.write(b"data: " + self.dumps(final) + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
            return resp
        payload = {"id": "x", "object": "text_completion", "model": body["model"],
                   "choices": [{"index": 0, "text": "ok"}], "usage": usage,
                   "served_by": self.name, "seen_headers": headers}
        return web.Response(body=self.dumps(payload), content_type="application/json",
                            headers=who)

    async def start(self) -> FakeModelServer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/{tail:.*}", self._infer)
        await self._serve(app)
        return self


class EppProcess:
    """The real ``epp`` command in a subprocess, plaintext, waiting until health SERVING
    (``manifests`` None: no ``--manifests``, e.g. a config with ``dataLayer.discovery``)."""

    def __init__(self, manifests: Any, *extra: str, log_path: Any = None) -> None:
        import os
        import subprocess
        import sys
        import tempfile

        from devkit.envoy import free_port

        self.port, self.health, self.metrics = free_port(), free_port(), free_port()
        self.log_path = log_path or tempfile.mktemp(prefix="epp-", suffix=".log")
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "epp.main",
             *(["--manifests", str(manifests)] if manifests is not None else []),
             "--secure-serving=false", "--grpc-port", str(self.port),
             "--grpc-health-port", str(self.health), "--metrics-port", str(self.metrics),
             "--grace-period", "2", *extra],
            stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def wait_serving(self, timeout: float = 20) -> EppProcess:
        import time

        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"epp exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with grpc.insecure_channel(f"127.0.0.1:{self.health}") as ch:
                    status = health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=1).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return self
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"epp not serving: {self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def pool_gateway_config(epp_port: int, admin: int, listen: int, *,
                        mode: str = "FULL_DUPLEX_STREAMED", tls: bool = False,
                        endpoints: Sequence[str] | None = None,
                        num_retries: int = 2,
                        epp_replicas: Sequence[tuple[int, int]] = ()) -> dict[str, Any]:
    """Envoy with one pool route: the EPP filter, then the pool's endpoints.

    With ``endpoints`` (``ip:port`` of every pod, as a Gateway knows them from the
    InferencePool) the pool is an ``override_host`` cluster whose route retries down the EPP's
    fallback list (:func:`devkit.envoy.pool_cluster`); without, an ORIGINAL_DST cluster that
    takes a single picked endpoint. The route copies the ``envoy.lb`` metadata value into
    ``x-lb-metadata`` so a backend can show that header and metadata agree, and answers with
    ``x-served-endpoint``: the endpoint Envoy recorded as the one that served.
    ``epp_replicas`` (``(grpc_port, health_port)`` each) replaces ``epp_port`` by a
    health-checked cluster of several EPP replicas.
    """
    from devkit.topology import Pool, Topology

    return Topology(
        listen=listen, admin=admin, mode=mode, tls=tls,
        epp_forwarding=["envoy.lb.subset_hint"],
        pools=[Pool("pool", cluster="pool", epp_cluster="epp", epp_port=epp_port,
                    request_headers_to_add=[("x-lb-metadata",
                        "%DYNAMIC_METADATA(envoy.lb:x-gateway-destination-endpoint)%")],
                    endpoints=[(h, int(p)) for h, _, p in
                               (ep.rpartition(":") for ep in endpoints or ())],
                    num_retries=num_retries, epp_replicas=epp_replicas,
                    served_header="x-served-endpoint" if endpoints else None)],
    ).bootstrap()
