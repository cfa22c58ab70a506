"""``maxPrefillConcurrency`` end to end: real Envoy → real ``epp`` (flow control on the
``concurrency-detector``, 8 slots, one request awaiting its first token per endpoint) → a
small real model server that streams each response in two steps the test lets go: the first
token, then the rest. The first token, seen by the EPP in the response stream, frees the
endpoint for the next request while the first one is still streaming; a client that hangs up
before its first token frees it too."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest
from aiohttp import web

from devkit import envoy as e
from tests.epp.flowcontrol.test_flowcontrol_envoy import Gateway, until
from tests.support.processes import BackgroundLoop, FakeModelServer

pytestmark = pytest.mark.envoy

CONFIG = """\
featureGates: [flowControl]
plugins:
- type: concurrency-detector
  parameters: {maxConcurrency: 8, maxPrefillConcurrency: 1}
saturationDetector: {pluginRef: concurrency-detector}
flowControl:
  defaultRequestTTL: 60s
"""


class TwoStepServer(FakeModelServer):
    """Streams each request's first token once ``tokens`` passes its arrival index, and the
    rest (and the end) once ``ends`` does."""

    def __init__(self, name: str, host: str, port: int) -> None:
        super().__init__(name, host, port)
        self.tokens = 0
        self.ends = 0

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append({"body": body, "headers": dict(request.headers)})
        arrival = len(self.requests) - 1
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for gate in ("tokens", "ends"):
            while getattr(self, gate) <= arrival:
                await asyncio.sleep(0.01)
            event = {"id": "x", "model": body["model"],
                     "choices": [{"index": 0, "text": f"{gate} "}]}
            await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture
def server(bg: BackgroundLoop) -> Iterator[TwoStepServer]:
    s = TwoStepServer("pod-0", "127.0.1.1", e.free_port())
    bg.run(s.start())
    yield s
    s.tokens = s.ends = 10**6
    bg.run(s.stop())


@pytest.fixture
def gw(bg: BackgroundLoop, tmp_path: Path, server: TwoStepServer) -> Iterator[Gateway]:
    g = Gateway(bg, tmp_path, server, config=CONFIG)
    yield g
    g.stop()


def stream(gw: Gateway, prompt: str, timeout: float = 60) -> httpx.Response:
    body = orjson.dumps({"model": "base-model", "prompt": prompt, "max_tokens": 2,
                         "stream": True})
    return httpx.post(f"http://127.0.0.1:{gw.port}/v1/completions", content=body,
                      headers={"x-gateway-inference-objective": "standard"}, timeout=timeout)


def test_the_first_token_lets_the_next_request_go(gw: Gateway, server: TwoStepServer) -> None:
    pool = ThreadPoolExecutor(4)
    first: Future[httpx.Response] = pool.submit(stream, gw, "first")
    until(lambda: len(server.requests) == 1, "the first request to reach the server")
    second = pool.submit(stream, gw, "second")
    until(lambda: gw.debug()["queued"] == 1, "the second request to wait in the EPP")
    assert len(server.requests) == 1  # 7 free slots, but the endpoint computes a prompt
    server.tokens = 1  # the first request's first token; it keeps streaming
    until(lambda: len(server.requests) == 2, "the second request to reach the server")
    assert not first.done() and gw.debug()["queued"] == 0
    server.tokens = server.ends = 10**6
    assert [f.result(timeout=30).status_code for f in (first, second)] == [200, 200]
    assert "ends" in first.result().text


def test_a_client_gone_before_its_first_token_frees_the_endpoint(
        gw: Gateway, server: TwoStepServer) -> None:
    pool = ThreadPoolExecutor(4)
    gone = pool.submit(stream, gw, "gone", timeout=1.0)
    until(lambda: len(server.requests) == 1, "the request to reach the server")
    waiting = pool.submit(stream, gw, "waiting")
    until(lambda: gw.debug()["queued"] == 1, "the next request to wait in the EPP")
    with pytest.raises(httpx.TimeoutException):
        gone.result(timeout=30)  # the client hangs up before any token came
    until(lambda: len(server.requests) == 2, "the broken stream to free the endpoint")
    server.tokens = server.ends = 10**6
    assert waiting.result(timeout=30).status_code == 200
