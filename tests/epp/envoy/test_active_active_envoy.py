"""Two active-active EPP replicas behind one real Envoy (its ext_proc cluster holds both),
sharing routing state through a real Valkey (docs/active-active.md): a prefix learnt through
one replica routes the same through the other, each replica sees the other's requests in
flight, and losing Valkey degrades to local state with a warning, then re-joins."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from devkit.valkey import ValkeyServer
from tests.support.picker import start_servers
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer, pool_gateway_config

pytestmark = pytest.mark.envoy

# ~10 blocks of 64 bytes each: enough prefix for the prefix scorer to dominate.
PREFIXES = [f"document {i}: " + ("lorem ipsum dolor sit amet " * 24) for i in range(4)]


def eventually(check: Callable[[], bool], what: str, within: float = 20.0) -> None:
    """Wait until ``check()`` holds; the deadline only bounds a failure (no timing is
    asserted)."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def metric(port: int, name: str) -> float:
    """Sum of every sample of ``name`` on an EPP's metrics port."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


class ActiveActive:
    """Envoy → ext_proc cluster {EPP a, EPP b} → the pool; both EPPs on one Valkey."""

    def __init__(self, tmp: Path, servers: list[FakeModelServer], store_url: str) -> None:
        manifests = tmp / "pool.yaml"
        write_yaml(manifests, pool_manifests("pool", [(s.name, s.host) for s in servers],
                                             servers[0].port))
        args = ("--ha-mode", "active-active", "--state-store", store_url)
        self.epps = [EppProcess(manifests, *args, log_path=tmp / f"epp-{n}.log")
                     for n in ("a", "b")]
        for epp in self.epps:
            epp.wait_serving()
        admin, self.port = e.free_port(), e.free_port()
        config = pool_gateway_config(self.epps[0].port, admin, self.port,
                                     epp_replicas=[(p.port, p.health) for p in self.epps])
        self.envoy = e.Envoy(config, admin_port=admin, workdir=tmp / "envoy").start()

    def complete(self, prompt: str, *, stream: bool = False) -> httpx.Response:
        body = orjson.dumps({"model": "base-model", "prompt": prompt, "max_tokens": 1,
                             "stream": stream})
        return httpx.post(f"http://127.0.0.1:{self.port}/v1/completions", content=body,
                          timeout=30)

    def picks(self) -> list[float]:
        """Requests each replica has routed so far."""
        return [metric(p.metrics, "inference_objective_request_total") for p in self.epps]

    def indexes(self) -> list[float]:
        return [metric(p.metrics, "inference_extension_prefix_indexer_size") for p in self.epps]

    def debug_pool(self, epp: EppProcess) -> list[dict[str, Any]]:
        r = httpx.get(f"http://127.0.0.1:{epp.metrics}/debug/pool", timeout=5)
        return list(r.json()["endpoints"])

    def inflight(self, epp: EppProcess) -> tuple[int, int]:
        """(requests in flight on the pool as ``epp`` sees them, the part from others)."""
        eps = self.debug_pool(epp)
        return (sum(x["inflight_requests"] for x in eps),
                sum(x["remote_inflight_requests"] for x in eps))

    def learn_everywhere(self, prompt: str) -> str:
        """Send ``prompt`` once, wait until both replicas' indexes agree; its endpoint."""
        r = self.complete(prompt)
        assert r.status_code == 200, r.text
        eventually(lambda: len(set(self.indexes())) == 1,
                   "both replicas hold the same prefix index")
        return str(r.json()["served_by"])

    def stop(self) -> None:
        self.envoy.stop()
        for epp in self.epps:
            epp.stop()


@pytest.fixture
def servers(bg: BackgroundLoop) -> Iterator[list[FakeModelServer]]:
    started = start_servers(bg, 3)
    yield started
    for s in started:
        bg.run(s.stop())


@pytest.fixture
def valkey() -> Iterator[ValkeyServer]:
    with ValkeyServer() as server:
        yield server


@pytest.fixture
def gateway(tmp_path: Path, servers: list[FakeModelServer],
            valkey: ValkeyServer) -> Iterator[ActiveActive]:
    gw = ActiveActive(tmp_path, servers, valkey.url)
    eventually(lambda: all(metric(p.metrics, "inference_extension_state_store_up") == 1
                           for p in gw.epps), "both replicas share state")
    yield gw
    gw.stop()


def test_a_prefix_learnt_through_one_replica_routes_the_same_through_the_other(
        gateway: ActiveActive) -> None:
    learnt = {p: gateway.learn_everywhere(p) for p in PREFIXES}
    before = gateway.picks()
    for prefix, endpoint in learnt.items():
        for i in range(4):
            r = gateway.complete(f"{prefix} question {i}")
            assert r.status_code == 200, r.text
            assert r.json()["served_by"] == endpoint, (prefix[:12], i)
    after = gateway.picks()
    # Envoy spread the follow-ups over both replicas: each routed some by the other's learning.
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def test_each_replica_sees_the_requests_the_other_has_in_flight(
        gateway: ActiveActive, servers: list[FakeModelServer]) -> None:
    for s in servers:
        s.stream_delay = 1.5  # each streamed request stays in flight ~5 s
    n = 6
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(gateway.complete, f"q{i}", stream=True) for i in range(n)]
        # Every replica sees all n in flight; part of them through the store (the other's).
        eventually(lambda: all(gateway.inflight(p)[0] == n for p in gateway.epps),
                   f"both replicas count all {n} requests in flight")
        remote = [gateway.inflight(p)[1] for p in gateway.epps]
        assert sum(remote) == n and all(r > 0 for r in remote), remote
        assert all(f.result().status_code == 200 for f in futures)
    eventually(lambda: all(gateway.inflight(p) == (0, 0) for p in gateway.epps),
               "the counts drain on both replicas")


def test_losing_valkey_degrades_to_local_state_and_recovers(
        gateway: ActiveActive, valkey: ValkeyServer) -> None:
    gateway.learn_everywhere(PREFIXES[0])
    valkey.kill()
    up = "inference_extension_state_store_up"
    eventually(lambda: all(metric(p.metrics, up) == 0 for p in gateway.epps),
               "both replicas notice the store is gone")
    for p in gateway.epps:
        assert "state store unreachable; routing on this replica's local state" in \
            Path(p.log_path).read_text()
    # No request fails while the store is down; routing continues on local state.
    for i in range(8):
        assert gateway.complete(f"{PREFIXES[1]} while down {i}").status_code == 200
    valkey.start()
    eventually(lambda: all(metric(p.metrics, up) == 1 for p in gateway.epps),
               "both replicas re-join the restarted store")
    # Shared learning works again (a restarted, empty Valkey is refilled by the replicas).
    learnt = gateway.learn_everywhere(PREFIXES[2])
    for i in range(4):
        assert gateway.complete(f"{PREFIXES[2]} again {i}").json()["served_by"] == learnt


def test_a_killed_replica_leaves_the_rotation_and_the_survivor_has_the_shared_state(
        gateway: ActiveActive) -> None:
    learnt = {p: gateway.learn_everywhere(p) for p in PREFIXES[:2]}
    dead = gateway.epps[0]
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait()
    codes = [gateway.complete(f"{PREFIXES[0]} after the kill {i}") for i in range(12)]
    # No stream was open on the dead replica, so nothing fails: the first stream Envoy sends
    # there (before ejecting it) fails to connect and is retried on the survivor.
    assert [r.status_code for r in codes] == [200] * 12
    # Every later request goes through the survivor, which learnt from both replicas.
    for prefix, endpoint in learnt.items():
        for i in range(3):
            r = gateway.complete(f"{prefix} survivor {i}")
            assert r.status_code == 200 and r.json()["served_by"] == endpoint
