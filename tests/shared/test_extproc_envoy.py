"""The shared ext_proc state machine against a real Envoy, with a test Exchange that mutates
requests and responses and records how streams end."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import orjson
import pytest

from devkit import envoy as e
from shared.extproc import (
    Exchange,
    ExtProcServicer,
    RequestDecision,
    ResponseHeadersDecision,
)
from tests.support.processes import BackgroundLoop, EchoBackend, InProcessService

pytestmark = pytest.mark.envoy


@dataclass
class Journal:
    closed: list[bool] = field(default_factory=list)
    #: How each stream carrying an ``x-test-id`` header ended, by that id.
    by_id: dict[str, bool] = field(default_factory=dict)


class Rewriting(Exchange):
    """Adds a header and metadata, renames ``model`` in the body both ways."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.test_id = ""

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestDecision:
        self.test_id = headers.get("x-test-id", "")
        if not body:
            return RequestDecision(set_headers={"x-seen": "headers-only"})
        data = orjson.loads(body)
        data["model"] = "rewritten-" + data["model"]
        return RequestDecision(
            set_headers={"x-seen": "yes"},
            body=orjson.dumps(data),
            metadata={"envoy.lb": {"x-test-meta": "meta-value"}},
        )

    async def on_response_headers(self, headers: dict[str, str]) -> ResponseHeadersDecision:
        sse = headers.get("content-type", "").startswith("text/event-stream")
        return ResponseHeadersDecision(set_headers={"x-response-seen": "1"}, buffer_body=not sse)

    def on_response_chunk(self, chunk: bytes, end_of_stream: bool) -> bytes:
        return chunk.replace(b'"i"', b'"index"')

    def on_response_body(self, body: bytes) -> bytes:
        return body.replace(b'"backend":"echo"', b'"backend":"echo-rewritten"')

    def on_close(self, completed: bool) -> None:
        self.journal.closed.append(completed)
        if self.test_id:
            self.journal.by_id[self.test_id] = completed


@dataclass
class Proxy:
    envoy: e.Envoy
    port: int
    journal: Journal
    bg: BackgroundLoop

    def url(self, path: str = "/v1/completions") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture(scope="module")
def echo(bg: BackgroundLoop) -> Iterator[EchoBackend]:
    server = bg.run(EchoBackend("echo").start())
    yield server
    bg.run(server.stop())


def make_proxy(bg: BackgroundLoop, echo: EchoBackend, mode: str, *, tls: bool,
               runtime: dict[str, bool] | None = None) -> tuple[Proxy, InProcessService]:
    journal = Journal()
    svc = InProcessService(bg, ExtProcServicer(lambda: Rewriting(journal)), secure=tls).start()
    admin, listen = e.free_port(), e.free_port()
    response_mode = "FULL_DUPLEX_STREAMED" if mode == "FULL_DUPLEX_STREAMED" else "STREAMED"
    filt = e.ext_proc_filter("proc", request_body_mode=mode, response_body_mode=response_mode,
                             response_headers=True)
    routes = [e.route("echo", request_headers_to_add=[
        ("x-meta-echo", "%DYNAMIC_METADATA(envoy.lb:x-test-meta)%")])]
    cfg = e.bootstrap(admin, [e.listener(listen, routes, [filt])], [
        e.grpc_cluster("proc", svc.port, tls=tls),
        e.static_cluster("echo", [("127.0.0.1", echo.port)]),
    ], runtime=runtime)
    return Proxy(e.Envoy(cfg, admin_port=admin).start(), listen, journal, bg), svc


@pytest.fixture(scope="module", params=["BUFFERED", "FULL_DUPLEX_STREAMED"])
def proxy(request: pytest.FixtureRequest, bg: BackgroundLoop, echo: EchoBackend
          ) -> Iterator[Proxy]:
    p, svc = make_proxy(bg, echo, request.param, tls=False)
    yield p
    p.envoy.stop()
    svc.stop()


def test_request_body_rewrite_reaches_upstream_with_right_length(proxy: Proxy) -> None:
    r = httpx.post(proxy.url(), content=b'{"model": "m", "prompt": "p"}')
    assert r.status_code == 200
    seen = r.json()
    expected = orjson.dumps({"model": "rewritten-m", "prompt": "p"})
    assert seen["length"] == len(expected)
    assert seen["headers"]["x-seen"] == "yes"
    if "content-length" in seen["headers"]:
        assert int(seen["headers"]["content-length"]) == len(expected)


def test_dynamic_metadata_reaches_envoy(proxy: Proxy) -> None:
    r = httpx.post(proxy.url(), content=b'{"model": "m"}')
    assert r.json()["headers"]["x-meta-echo"] == "meta-value"


def test_headers_only_request_is_decided_on_headers(proxy: Proxy) -> None:
    r = httpx.get(proxy.url("/v1/models"))
    assert r.json()["headers"]["x-seen"] == "headers-only"


def test_buffered_response_body_is_rewritten_with_correct_length(proxy: Proxy) -> None:
    r = httpx.post(proxy.url(), content=b'{"model": "m"}')
    assert r.headers["x-response-seen"] == "1"
    assert r.json()["backend"] == "echo-rewritten"
    if "content-length" in r.headers:
        assert int(r.headers["content-length"]) == len(r.content)


def test_sse_chunks_are_rewritten_as_they_stream(proxy: Proxy) -> None:
    start = time.monotonic()
    with httpx.stream("POST", proxy.url("/sse?n=4&delay=0.3"), content=b'{"model": "m"}') as r:
        lines = (line for line in r.iter_lines() if line.startswith("data:"))
        first = next(lines)
        first_at = time.monotonic() - start
        rest = list(lines)
    assert first == 'data: {"index": 0}'
    assert rest[-1] == "data: [DONE]"
    assert first_at < 0.6


def test_stream_closes_completed_after_a_full_exchange(proxy: Proxy) -> None:
    test_id = f"full-{proxy.port}"
    httpx.post(proxy.url(), content=b'{"model": "m"}', headers={"x-test-id": test_id})
    deadline = time.monotonic() + 5
    while test_id not in proxy.journal.by_id and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proxy.journal.by_id[test_id] is True


def test_client_disconnect_mid_body_closes_stream_without_leaks(
        bg: BackgroundLoop, echo: EchoBackend) -> None:
    p, svc = make_proxy(bg, echo, "FULL_DUPLEX_STREAMED", tls=False)
    try:
        async def task_count() -> int:
            return len(asyncio.all_tasks())

        httpx.post(p.url(), content=b'{"model": "warm-up"}')
        deadline = time.monotonic() + 5
        while not p.journal.closed and time.monotonic() < deadline:
            time.sleep(0.02)  # the warm-up's stream is closed before counting
        tasks_before = bg.run(task_count())
        closed_before = len(p.journal.closed)
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", p.port)) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: 100000\r\n\r\n" + b'{"model": "m", "p": "' + b"x" * 500)
                time.sleep(0.1)
        deadline = time.monotonic() + 5
        while len(p.journal.closed) < closed_before + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.journal.closed[closed_before:] == [False] * 5
        time.sleep(0.2)
        assert bg.run(task_count()) <= tasks_before
    finally:
        p.envoy.stop()
        svc.stop()


def test_tls_between_envoy_and_service(bg: BackgroundLoop, echo: EchoBackend) -> None:
    p, svc = make_proxy(bg, echo, "FULL_DUPLEX_STREAMED", tls=True)
    try:
        r = httpx.post(p.url(), content=b'{"model": "m"}')
        assert r.status_code == 200
        assert r.json()["headers"]["x-seen"] == "yes"
    finally:
        p.envoy.stop()
        svc.stop()


@pytest.mark.parametrize("graceful", [False, True], ids=["envoy-default", "graceful-close"])
def test_envoy_resets_ext_proc_streams_unless_graceful_close_is_on(
        bg: BackgroundLoop, echo: EchoBackend, graceful: bool) -> None:
    """The Envoy fact behind docs/kubernetes.md §5: by default every stream ends in a reset
    (which grpc.aio leaks memory on); with the runtime key, none does."""
    p, svc = make_proxy(bg, echo, "FULL_DUPLEX_STREAMED", tls=False,
                        runtime=e.GRACEFUL_CLOSE if graceful else None)
    try:
        for _ in range(10):
            assert httpx.post(p.url(), content=b'{"model": "m"}').status_code == 200
        deadline = time.monotonic() + 5
        while len(p.journal.closed) < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # Envoy resets when it destroys the HTTP stream, just after the reply
        resets = p.envoy.stats("cluster.proc.upstream_rq_tx_reset").get(
            "cluster.proc.upstream_rq_tx_reset", 0)
        assert resets == (0 if graceful else 10)
        assert p.journal.closed == [True] * 10
    finally:
        p.envoy.stop()
        svc.stop()
