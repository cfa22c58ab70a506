"""Slow clients and overload through the real Envoy (issue 31, item 1).

Scale here (2 cores, shared): 1,100 slow clients — past Envoy's default 1,024 requests per
cluster, where every request to every pool got a bare 500. The issue's figures (5,000 slow
clients, 3,000 streams) are ``python -m bench.overload`` (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit import envoy as e
from devkit.overload import Limits
from devkit.reliability.gateway import Gateway, PoolDef, start_gateway
from devkit.reliability.slowclients import legit_requests, open_slow, replies
from tests.support.processes import BackgroundLoop, FakeModelServer

pytestmark = pytest.mark.envoy

MODEL = "llama-8b"
SLOW = 1_100


@dataclass
class Pool:
    servers: list[FakeModelServer]
    pool: PoolDef


@pytest.fixture(scope="module")
def pool(bg: BackgroundLoop) -> Iterator[Pool]:
    port = e.free_port()
    servers = [bg.run(FakeModelServer(f"p{i}", f"127.0.22.{i + 1}", port).start())
               for i in range(2)]
    for s in servers:
        s.model = MODEL
    yield Pool(servers, PoolDef("llama", [MODEL], [(s.name, s.host) for s in servers], port))
    for s in servers:
        bg.run(s.stop())


def start(tmp: Path, pool: Pool, limits: Limits | None) -> Gateway:
    return start_gateway(tmp, [pool.pool], mode="FULL_DUPLEX_STREAMED", limits=limits)


def test_slow_clients_past_1024_do_not_take_the_gateway_down(
        pool: Pool, tmp_path: Path) -> None:
    gw = start(tmp_path, pool, Limits())
    try:
        slow = open_slow(gw.listen, SLOW, model=MODEL)
        try:
            out = asyncio.run(legit_requests(gw.url(), 100, 8, model=MODEL))
        finally:
            for s in slow:
                s.close()
        assert out.ok == out.total == 100, out.counts
    finally:
        gw.stop()


def test_overflow_is_a_json_503_and_slow_clients_are_shed(pool: Pool, tmp_path: Path) -> None:
    """A small breaker (40) filled by 60 slow clients: refusals are OpenAI-shaped 503s, the
    slow clients get a JSON 408 at the request timeout, and then legitimate requests pass."""
    limits = Limits(max_requests=40, max_connections=40, request_timeout="3s")
    gw = start(tmp_path, pool, limits)
    try:
        slow = open_slow(gw.listen, 60, model=MODEL)
        during = asyncio.run(legit_requests(gw.url(), 20, 4, model=MODEL))
        assert during.bare == 0, during.counts
        assert during.counts["503 json"] > 0, during.counts
        shed = replies(slow, timeout=10)
        # Held ones are shed with a JSON 408; the ones over the breaker got a JSON 503.
        assert set(shed) <= {"408 json", "503 json"}, shed
        assert shed["408 json"] >= 30, shed
        after = asyncio.run(legit_requests(gw.url(), 20, 4, model=MODEL))
        assert after.ok == 20, after.counts
    finally:
        gw.stop()
