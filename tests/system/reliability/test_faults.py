"""Faults under load through the real Envoy, BBR and EPP in front of a ``vllm-sim`` fleet
(short forms; ``python -m bench run server-restart --real`` is the long one)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import orjson
import pytest

from devkit.reliability.faultkit import (
    MODEL,
    SimFleet,
    load,
    percentile,
    start_sim_gateway,
    wait_until,
)
from devkit.reliability.gateway import Gateway, open_fds, threads

pytestmark = [pytest.mark.envoy, pytest.mark.serial]

SCRAPE_INTERVAL = 0.05
STALENESS = 0.5


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    f = SimFleet(4, tmp_path_factory.mktemp("fleet")).start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def gateway(fleet: SimFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_sim_gateway(tmp_path_factory.mktemp("gw"), fleet, epp_args=(
        "--refresh-metrics-interval", f"{int(SCRAPE_INTERVAL * 1000)}ms",
        "--metrics-staleness-threshold", f"{int(STALENESS * 1000)}ms"))
    yield gw
    gw.stop()


def pool_state(gw: Gateway) -> dict[str, dict]:
    body = orjson.loads(gw.epps["sim"].get("/debug/pool")[1])
    return {ep["name"].removesuffix("-rank-0"): ep for ep in body["endpoints"]}


def inflight(gw: Gateway) -> int:
    return sum(ep["inflight_requests"] for ep in pool_state(gw).values())


def all_healthy(gw: Gateway) -> bool:
    return all(ep["healthy"] and ep["age_seconds"] is not None
               and ep["age_seconds"] < STALENESS for ep in pool_state(gw).values())


def test_killed_server_loses_only_its_requests_and_rejoins(fleet: SimFleet,
                                                           gateway: Gateway) -> None:
    wait_until(lambda: all_healthy(gateway), 10)
    with load(gateway.url(), 8, max_tokens=30) as running:
        time.sleep(1.5)
        killed_at = time.monotonic()
        fleet.kill(3, revive_after=3.0)
        time.sleep(5.0)
    results = running.results
    after_detection = [r for r in results
                       if killed_at + SCRAPE_INTERVAL + 1.0 <= r.start < killed_at + 3.0]
    assert after_detection and all(r.status == 200 and r.pod != "pod-3"
                                   for r in after_detection)
    failed = [r for r in results if r.status != 200]
    assert all(killed_at - 1.0 <= r.start <= killed_at + SCRAPE_INTERVAL + 1.0
               for r in failed), [(round(r.start - killed_at, 3), r.status, r.pod) for r in failed
                            if r.start > killed_at + SCRAPE_INTERVAL + 1.0]
    rejoined = [r for r in results if r.start > killed_at + 3.0 and r.pod == "pod-3"]
    assert rejoined, "the revived server got no traffic"


def test_hung_metrics_never_delay_picks_and_the_server_is_avoided_once_stale(
        fleet: SimFleet, gateway: Gateway) -> None:
    wait_until(lambda: all_healthy(gateway), 10)
    with load(gateway.url(), 4, max_tokens=4) as before:
        time.sleep(1.5)
    try:
        fleet.faults(2, metrics_hang=True)
        hung_at = time.monotonic()
        with load(gateway.url(), 4, max_tokens=4) as during:
            time.sleep(3.0)
    finally:
        fleet.faults(2, metrics_hang=False)
    ok_before = [r.latency for r in before.results if r.status == 200]
    ok_during = [r.latency for r in during.results if r.status == 200]
    assert len(ok_during) == len(during.results)
    assert percentile(ok_during, 0.5) < percentile(ok_before, 0.5) * 1.5 + 0.01
    stale = [r for r in during.results if r.start > hung_at + STALENESS + 0.3]
    assert stale and all(r.pod != "pod-2" for r in stale)


def test_epp_down_fails_requests_fast_and_recovers_within_two_seconds(
        fleet: SimFleet, gateway: Gateway) -> None:
    epp = gateway.epps["sim"]
    epp.kill()
    try:
        start = time.monotonic()
        r = httpx.post(gateway.url(), content=orjson.dumps({"model": MODEL, "prompt": "x"}),
                       timeout=10)
        assert r.status_code >= 500 and time.monotonic() - start < 1.0
    finally:
        epp.start().wait_serving()
    serving_at = time.monotonic()
    wait_until(lambda: _ok(gateway), 2.0 - (time.monotonic() - serving_at))


def test_bbr_down_fails_requests_fast_and_recovers_within_two_seconds(
        gateway: Gateway) -> None:
    gateway.bbr.kill()
    try:
        start = time.monotonic()
        r = httpx.post(gateway.url(), content=orjson.dumps({"model": MODEL, "prompt": "x"}),
                       timeout=10)
        assert r.status_code >= 500 and time.monotonic() - start < 1.0
    finally:
        gateway.bbr.start().wait_serving()
    serving_at = time.monotonic()
    wait_until(lambda: _ok(gateway), 2.0 - (time.monotonic() - serving_at))


def _ok(gw: Gateway) -> bool:
    body = orjson.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2})
    return httpx.post(gw.url(), content=body, timeout=5).status_code == 200


def ext_proc_streams(gw: Gateway, cluster: str) -> int:
    """ext_proc streams Envoy holds open to ``cluster``: one per request in that filter."""
    key = f"cluster.{cluster}.upstream_rq_active"
    return gw.envoy.stats(key).get(key, 0)


def test_slow_loris_and_mid_stream_disconnects_release_everything(gateway: Gateway) -> None:
    epp_pid = gateway.epps["sim"].proc.pid  # type: ignore[union-attr]
    _ok(gateway)

    def streams(cluster: str) -> int:
        return ext_proc_streams(gateway, cluster)

    wait_until(lambda: streams("bbr") == streams("epp-sim") == inflight(gateway) == 0, 5)
    fds_before, threads_before = open_fds(epp_pid), threads(epp_pid)
    body = orjson.dumps({"model": MODEL, "prompt": "x" * 200, "max_tokens": 900,
                         "stream": True})
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    lorises = [socket.create_connection(("127.0.0.1", gateway.listen)) for _ in range(10)]
    for s in lorises:
        s.sendall(head + body[:20])  # then nothing: a slow-loris body
    # BBR must read the whole body to learn the model, so a slow-loris body stalls there and
    # never reaches the EPP's filter: Envoy holds a BBR stream open for each, none to the EPP.
    wait_until(lambda: streams("bbr") >= 10, 5)
    assert streams("epp-sim") == 0
    with ExitStack() as clients:
        readers = []  # kept: dropping a reader closes its response
        for _ in range(8):  # streams that are routed and running: read a first event
            r = clients.enter_context(httpx.stream("POST", gateway.url(), content=body,
                                                   timeout=10))
            readers.append(r.iter_bytes())
            next(readers[-1])
            assert r.status_code == 200
        # Most of them are still streaming when their clients hang up (a slow machine may
        # finish the first few before the last one starts).
        wait_until(lambda: inflight(gateway) >= 4 and streams("epp-sim") >= 4, 5)
    # ... and now every client hangs up mid-body or mid-stream.
    for s in lorises:
        s.close()
    wait_until(lambda: inflight(gateway) == 0, 5)
    wait_until(lambda: streams("bbr") == streams("epp-sim") == 0, 5)
    wait_until(lambda: open_fds(epp_pid) <= fds_before + 2, 5)
    assert threads(epp_pid) <= threads_before + 2


def test_overload_sheds_sheddable_traffic_and_bounds_critical_latency(
        gateway: Gateway, fleet: SimFleet) -> None:
    with load(gateway.url(), 2, objective="chat", max_tokens=8) as idle:
        time.sleep(1.5)
    idle_p90 = percentile([r.latency for r in idle.results if r.status == 200], 0.9)
    with load(gateway.url(), 48, objective="batch", max_tokens=64) as flood, \
            load(gateway.url(), 2, objective="chat", max_tokens=8) as critical:
        time.sleep(5.0)
    shed = [r for r in flood.results if r.status == 429]
    assert shed, "no sheddable request was shed"
    assert {r.status for r in flood.results} <= {200, 429}
    ok = [r.latency for r in critical.results if r.status == 200]
    assert len(ok) == len(critical.results)
    # Shedding holds the servers' queues near the saturation threshold (queue 5), so critical
    # latency stays bounded (about one short queue) instead of growing with the flood.
    assert percentile(ok, 0.9) < max(40 * idle_p90, 1.5), (idle_p90, percentile(ok, 0.9))
    assert max(r.latency for r in flood.results) < 10


def test_nothing_leaks_after_the_fault_tests(gateway: Gateway, tmp_path: Path) -> None:
    wait_until(lambda: inflight(gateway) == 0, 5)
    assert gateway.epps["sim"].serving() and gateway.bbr.serving()
