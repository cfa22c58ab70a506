"""The scraper against real model-server-like HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import functools
import random
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from epp.config import build
from epp.datastore import Datastore, build_snapshot, parse_object
from epp.metrics import Scraper, ScraperConfig
from epp.metrics.scraper import MAX_BACKOFF, MAX_PAGE_BYTES, MAX_WIRE_BYTES
from epp.requestcontrol import Director

PAGE = "vllm:num_requests_waiting 3\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n"


#: A valid page of ~15 MB: over the wire cap, under the decompressed one.
BIG_PAGE = (PAGE + "# padding " + "x" * 1000 + "\n") * 15_000


@functools.cache
def gzip_bomb() -> bytes:
    """64 MiB of zeros, gzipped: ~65 KB on the wire."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join(c.compress(block) for _ in range(64)) + c.flush()


class FakeServer:
    """A loopback HTTP server whose /metrics can answer, fail, hang, or be hostile: a
    ~15 MB page sent chunked ("big") or with its length ("big-cl"), or a gzip bomb."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.port = 0
        #: Requests received, and bytes of the last "big" page the client took.
        self.requests = 0
        self.sent = 0
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self.mode == "fail":
            return web.Response(status=500, text="boom")
        if self.mode == "hang":
            await asyncio.sleep(30)
        if self.mode == "big-cl":
            return web.Response(text=BIG_PAGE)
        if self.mode == "bomb":
            return web.Response(body=gzip_bomb(), headers={"Content-Encoding": "gzip",
                                                           "Content-Type": "text/plain"})
        if self.mode == "big":
            resp = web.StreamResponse()
            await resp.prepare(request)
            data, piece = BIG_PAGE.encode(), 1 << 16
            self.sent = 0
            try:
                for i in range(0, len(data), piece):
                    await resp.write(data[i:i + piece])
                    self.sent += len(data[i:i + piece])
                await resp.write_eof()
            except ConnectionError:  # the client stopped reading and closed
                pass
            return resp
        return web.Response(text=PAGE)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    s = FakeServer()
    await s.start()
    yield s
    await s.stop()


def datastore_for(ports: list[int], raw_pool: Callable[..., dict[str, Any]],
                  raw_pod: Callable[..., dict[str, Any]]) -> Datastore:
    ds = Datastore(failure_threshold=3)
    docs = [raw_pool(ports=tuple(ports)), raw_pod("a", "127.0.0.1")]
    objs = [parse_object(d) for d in docs]
    ds.replace(build_snapshot([o for o in objs if o], pool_name=None, pool_namespace="default"))
    return ds


async def eventually(check: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


FAST = ScraperConfig(interval=0.01, timeout=0.2)


async def test_scrape_installs_metrics(server: FakeServer, raw_pool, raw_pod) -> None:
    ds = datastore_for([server.port], raw_pool, raw_pod)
    async with Scraper(ds, FAST):
        await eventually(lambda: ds.views()[0].metrics.waiting == 3)
    assert ds.views()[0].metrics.kv_usage == 0.5


async def test_endpoint_never_read_leaves_the_candidates_when_scrapes_fail(
        server: FakeServer, raw_pool, raw_pod) -> None:
    server.mode = "fail"
    ds = datastore_for([server.port], raw_pool, raw_pod)
    async with Scraper(ds, FAST):
        await eventually(lambda: ds.candidates() == ())


async def test_endpoint_never_read_leaves_the_candidates_when_scrapes_hang(
        server: FakeServer, raw_pool, raw_pod) -> None:
    server.mode = "hang"
    ds = datastore_for([server.port], raw_pool, raw_pod)
    async with Scraper(ds, ScraperConfig(interval=0.01, timeout=0.05)):
        await eventually(lambda: ds.candidates() == ())


async def test_unhealthy_endpoint_recovers_when_scrapes_succeed(
    server: FakeServer, raw_pool, raw_pod
) -> None:
    server.mode = "fail"
    ds = datastore_for([server.port], raw_pool, raw_pod)
    async with Scraper(ds, FAST):
        await eventually(lambda: ds.candidates() == ())
        server.mode = "ok"
        await eventually(lambda: len(ds.candidates()) == 1)


async def test_endpoint_added_later_is_scraped(server: FakeServer, raw_pool, raw_pod) -> None:
    ds = Datastore()
    async with Scraper(ds, FAST):
        objs = [parse_object(d) for d in (raw_pool(ports=(server.port,)),
                                          raw_pod("a", "127.0.0.1"))]
        ds.replace(build_snapshot([o for o in objs if o], pool_name=None,
                                  pool_namespace="default"))
        await eventually(lambda: ds.views()[0].metrics.waiting == 3)


async def test_one_hanging_endpoint_does_not_delay_another(raw_pool, raw_pod) -> None:
    slow, fast = FakeServer(), FakeServer()
    await slow.start()
    await fast.start()
    try:
        slow.mode = "hang"
        ds = datastore_for([slow.port, fast.port], raw_pool, raw_pod)
        async with Scraper(ds, ScraperConfig(interval=0.01, timeout=5.0)):
            fast_view = ds.view(f"127.0.0.1:{fast.port}")
            assert fast_view is not None
            await eventually(lambda: fast_view.metrics.waiting == 3, timeout=1.0)
    finally:
        await slow.stop()
        await fast.stop()


async def test_error_pages_keep_a_read_endpoint_on_its_last_metrics(
        server: FakeServer, raw_pool, raw_pod) -> None:
    ds = datastore_for([server.port], raw_pool, raw_pod)
    view = ds.views()[0]
    async with Scraper(ds, FAST):
        await eventually(lambda: view.metrics.waiting == 3)
        server.mode = "fail"
        await eventually(lambda: view.consecutive_failures > ds.failure_threshold)
        assert ds.candidates() == (view,)
        assert view.metrics.waiting == 3


async def test_hung_metrics_on_every_pod_leave_them_candidates_and_picks_succeed(
        raw_pool, raw_pod) -> None:
    servers = [FakeServer() for _ in range(3)]
    for s in servers:
        await s.start()
    try:
        ds = datastore_for([s.port for s in servers], raw_pool, raw_pod)
        director = Director.of(build(datastore=ds, rng=random.Random(0)))
        async with Scraper(ds, ScraperConfig(interval=0.01, timeout=0.05)):
            await eventually(lambda: all(v.ever_scraped for v in ds.views()))
            for s in servers:
                s.mode = "hang"
            await eventually(lambda: all(v.consecutive_failures > ds.failure_threshold
                                         for v in ds.views()))
            assert len(ds.candidates()) == 3
            body = orjson.dumps({"model": "m", "prompt": "hello"})
            _, routed = director.route({":path": "/v1/completions"}, body, {})
            assert routed.endpoint in ds.views()
    finally:
        for s in servers:
            await s.stop()


async def test_a_read_endpoint_whose_server_refuses_connections_leaves_the_candidates(
        server: FakeServer, raw_pool, raw_pod) -> None:
    ds = datastore_for([server.port], raw_pool, raw_pod)
    async with Scraper(ds, FAST):
        await eventually(lambda: ds.views()[0].ever_scraped)
        await server.stop()
        await eventually(lambda: ds.candidates() == ())


async def test_an_endpoint_the_source_removed_is_no_candidate_and_no_longer_scraped(
        server: FakeServer, raw_pool, raw_pod) -> None:
    ds = datastore_for([server.port], raw_pool, raw_pod)
    async with Scraper(ds, FAST) as scraper:
        await eventually(lambda: ds.views()[0].ever_scraped)
        server.mode = "hang"
        ds.replace(build_snapshot([o for o in (parse_object(raw_pool(ports=(server.port,))),)
                                   if o], pool_name=None, pool_namespace="default"))
        assert ds.candidates() == ()
        await eventually(lambda: not scraper._tasks)


def test_the_caps_are_far_above_a_real_page() -> None:
    assert len(BIG_PAGE) > MAX_WIRE_BYTES and len(BIG_PAGE) < MAX_PAGE_BYTES
    assert len(gzip_bomb()) < MAX_WIRE_BYTES < MAX_PAGE_BYTES < 64 << 20


@pytest.mark.parametrize("mode", ["big", "big-cl"])
async def test_page_over_the_wire_cap_is_refused_without_reading_it_all(
        server: FakeServer, raw_pool, raw_pod, mode: str) -> None:
    server.mode = mode
    ds = datastore_for([server.port], raw_pool, raw_pod)
    scraper = Scraper(ds, ScraperConfig(timeout=5.0))
    await scraper.start()
    try:
        t0 = time.monotonic()
        assert not await scraper.scrape_once(ds.views()[0])
        assert time.monotonic() - t0 < 3.0
        if mode == "big":  # what the server got out: the cap plus socket buffers
            await asyncio.sleep(0.2)
            assert server.sent < len(BIG_PAGE) * 0.9
    finally:
        await scraper.stop()


async def test_gzip_bomb_is_refused_and_logged_once_naming_the_pod(
        server: FakeServer, raw_pool, raw_pod) -> None:
    server.mode = "bomb"
    gzip_bomb()
    ds = datastore_for([server.port], raw_pool, raw_pod)
    scraper = Scraper(ds, ScraperConfig(timeout=5.0))
    await scraper.start()
    try:
        with capture_logs() as logs:
            cpu = time.process_time()
            for _ in range(3):
                assert not await scraper.scrape_once(ds.views()[0])
            # Each scrape stops at the 16 MiB cap (~40 ms here); all 64 MiB: ~150 ms each.
            assert time.process_time() - cpu < 3 * 0.5
    finally:
        await scraper.stop()
    capped = [e for e in logs if e["event"].startswith("metrics page over the size cap")]
    assert len(capped) == 1 and capped[0]["log_level"] == "warning"
    assert capped[0]["pod"] == "a" and "decompressed" in capped[0]["error"]


async def test_a_failing_pod_is_scraped_far_less_often_than_every_interval(
        server: FakeServer, raw_pool, raw_pod) -> None:
    server.mode = "bomb"
    gzip_bomb()
    ds = datastore_for([server.port], raw_pool, raw_pod)
    async with Scraper(ds, ScraperConfig(interval=0.01, timeout=1.0)):
        cpu = time.process_time()
        await asyncio.sleep(2.0)
        cpu = time.process_time() - cpu
    # Every 10 ms that is ~200 scrapes and the whole of a core; with the backoff: 3 at the
    # interval, then 20, 40, ... ms up to 1 s: ~10.
    assert 3 <= server.requests <= 20
    assert cpu < 1.0


async def test_a_recovered_pod_is_scraped_at_the_interval_again(
        server: FakeServer, raw_pool, raw_pod) -> None:
    server.mode = "fail"
    ds = datastore_for([server.port], raw_pool, raw_pod)
    view = ds.views()[0]
    async with Scraper(ds, ScraperConfig(interval=0.01, timeout=1.0)):
        await asyncio.sleep(1.5)  # the backoff has grown to ~MAX_BACKOFF
        server.mode = "ok"
        await eventually(lambda: view.consecutive_failures == 0, timeout=MAX_BACKOFF + 1.0)
        before = server.requests
        await asyncio.sleep(0.5)
    assert server.requests - before >= 20  # ~50 at 10 ms
