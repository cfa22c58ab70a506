"""Bodies over the cap through the real Envoy in streaming mode (issue 31, item 6).

In FULL_DUPLEX_STREAMED, Envoy sends the body in whatever chunks it holds; when the ext_proc
stream is behind, one chunk can be far larger than the body cap (up to the listener's buffer
limit: 32 MiB here, as the local stack had it; a Gateway may set any). A chunk over the
services' gRPC message limit (cap + 1 MiB) failed the stream: a bare 500 instead of the JSON
413 (8 of 30 at 20 and 40 MB). A small cap (100 kB) makes the large chunks certain here.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devkit import envoy as e
from devkit.reliability.gateway import Gateway, PoolDef, start_gateway
from devkit.reliability.slowclients import legit_requests, open_slow, replies
from tests.support.processes import BackgroundLoop, FakeModelServer

pytestmark = pytest.mark.envoy

CAP = 100_000


@pytest.fixture(scope="module")
def gateway(bg: BackgroundLoop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    port = e.free_port()
    server = bg.run(FakeModelServer("p0", "127.0.23.1", port).start())
    server.model = "m"
    gw = start_gateway(tmp_path_factory.mktemp("large"), [PoolDef("p", ["m"], [("p0",
                       server.host)], port)], mode="FULL_DUPLEX_STREAMED",
                       bbr_args=("--max-body-bytes", str(CAP)),
                       epp_args=("--max-body-bytes", str(CAP)), buffer_limit=32 << 20)
    yield gw
    gw.stop()
    bg.run(server.stop())


def body(size: int) -> bytes:
    head = b'{"model": "m", "prompt": "'
    return head + b"x" * (size - len(head) - 2) + b'"}'


@pytest.mark.parametrize("size", [2_000_000, 20_000_000])
def test_bodies_over_the_cap_get_the_json_413_never_a_500(gateway: Gateway, size: int) -> None:
    seen: Counter[str] = Counter()
    payload = body(size)
    with httpx.Client(timeout=60) as client:
        for _ in range(8):
            r = client.post(gateway.url(), content=payload,
                            headers={"content-type": "application/json"})
            code = r.json()["error"]["code"] if r.status_code != 200 else "ok"
            seen[f"{r.status_code} {code}"] += 1
    assert seen == {"413 request_too_large": 8}, seen


def test_concurrent_uploads_are_bounded_by_the_body_budget(
        bg: BackgroundLoop, tmp_path: Path) -> None:
    """Issue 31, item 7: many capped bodies at once are bounded too. BBR may hold 4 MB of
    request bodies in all; 6 uploads stalled after 1.5 MB each: the ones past the budget get
    a JSON 503 at once, the held ones keep theirs, and once they end, requests pass."""
    port = e.free_port()
    server = bg.run(FakeModelServer("p0", "127.0.23.2", port).start())
    server.model = "m"
    gw = start_gateway(tmp_path, [PoolDef("p", ["m"], [("p0", server.host)], port)],
                       mode="FULL_DUPLEX_STREAMED",
                       bbr_args=("--max-buffered-body-bytes", "4000000"))
    try:
        slow = open_slow(gw.listen, 6, model="m", body_bytes=3_000_000)
        answered = replies(slow, timeout=3)
        assert answered["503 json"] >= 3, answered
        assert set(answered) <= {"503 json", "none"}, answered
        ok = asyncio.run(legit_requests(gw.url(), 10, 2, model="m"))
        assert ok.ok == 10, ok.counts
    finally:
        gw.stop()
        bg.run(server.stop())


def test_buffered_bodies_over_envoys_buffer_get_a_json_413(
        bg: BackgroundLoop, tmp_path: Path) -> None:
    """BUFFERED: Envoy holds at most the cap + 1 MiB (so 100 big uploads cannot each land
    in BBR whole); over it Envoy answers itself, as JSON, and the services' own 413 keeps its
    body (not wrapped by the mapping)."""
    port = e.free_port()
    gw = start_gateway(tmp_path, [PoolDef("p", ["m"], [("p0", "127.0.23.3")], port)],
                       mode="BUFFERED", bbr_args=("--max-body-bytes", str(CAP)))
    try:
        with httpx.Client(timeout=60) as client:
            for size, message in ((20_000_000, "Payload Too Large"),
                                  (CAP + 1000, f"larger than the {CAP}-byte limit")):
                r = client.post(gw.url(), content=body(size),
                                headers={"content-type": "application/json"})
                assert r.status_code == 413
                assert r.headers["content-type"] == "application/json"
                err = r.json()["error"]
                assert err["code"] == "request_too_large" and message in err["message"], err
                assert not err["message"].startswith("{")
    finally:
        gw.stop()
