"""EPP behaviour that needs its own pool: error statuses, the subset hint, live manifest
reloads under load, BUFFERED mode, and the simulator fleet with the default profile."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from sim import ServerConfig, start_fleet
from sim.profiles import TINY
from tests.support.picker import OBJECTIVES, REWRITE, Pool, start_pool, start_servers
from tests.support.processes import BackgroundLoop, EppProcess, pool_gateway_config

pytestmark = pytest.mark.envoy


@pytest.fixture
def servers(bg: BackgroundLoop) -> Iterator[list]:
    s = start_servers(bg, 3)
    yield s
    for server in s:
        bg.run(server.stop())


def stop(pool: Pool) -> None:
    pool.envoy.stop()
    pool.epp.stop()


def test_unknown_model_gets_404_when_rejecting_unknown_models(
        bg: BackgroundLoop, tmp_path: Path, servers: list) -> None:
    pool = start_pool(bg, tmp_path, servers, "--reject-unknown-models")
    try:
        time.sleep(0.3)  # the servers' model names arrive with the first scrapes
        r = httpx.post(pool.url(), content=b'{"model": "nobody-serves-this", "prompt": "x"}')
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "model_not_found"
        ok = httpx.post(pool.url(), content=b'{"model": "base-model", "prompt": "x"}')
        assert ok.status_code == 200
        rewritten = httpx.post(pool.url(), content=b'{"model": "food-review", "prompt": "x"}')
        assert rewritten.status_code == 200
    finally:
        stop(pool)


def test_body_over_the_cap_gets_413(bg: BackgroundLoop, tmp_path: Path, servers: list) -> None:
    pool = start_pool(bg, tmp_path, servers, "--max-body-bytes", "1000")
    try:
        body = orjson.dumps({"model": "base-model", "prompt": "x" * 2000})
        r = httpx.post(pool.url(), content=body)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "request_too_large"
    finally:
        stop(pool)


def test_no_ready_endpoint_gets_503(bg: BackgroundLoop, tmp_path: Path, servers: list) -> None:
    for s in servers:
        s.metrics_status = 500
    pool = start_pool(bg, tmp_path, servers)
    try:
        time.sleep(0.5)  # three failed scrapes each
        r = httpx.post(pool.url(), content=b'{"model": "base-model", "prompt": "x"}')
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "service_unavailable"
    finally:
        stop(pool)


def subset_gateway(epp_port: int, admin: int, listen: int, subset: list[str],
                   endpoints: list[str]) -> dict:
    """The pool gateway with a set_metadata filter putting a subset hint before the EPP."""
    cfg = pool_gateway_config(epp_port, admin, listen, endpoints=endpoints)
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    hcm["typed_config"]["http_filters"].insert(0, {
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [{"metadata_namespace": "envoy.lb.subset_hint",
                          "value": {"x-gateway-destination-endpoint-subset": subset}}],
        },
    })
    return cfg


@pytest.mark.parametrize("subset_size", [1, 0])
def test_subset_hint_limits_candidates(bg: BackgroundLoop, tmp_path: Path, servers: list,
                                       subset_size: int) -> None:
    pool = start_pool(bg, tmp_path, servers)
    allowed = [servers[1].key][:subset_size]
    admin, listen = e.free_port(), e.free_port()
    try:
        with e.Envoy(subset_gateway(pool.epp.port, admin, listen, allowed,
                                    [s.key for s in servers]), admin_port=admin):
            url = f"http://127.0.0.1:{listen}/v1/completions"
            statuses = Counter()
            served = Counter()
            for i in range(10):
                r = httpx.post(url, content=orjson.dumps({"model": "m", "prompt": f"{i}"}))
                statuses[r.status_code] += 1
                if r.status_code == 200:
                    served[r.json()["served_by"]] += 1
            if subset_size:
                assert served == Counter({servers[1].name: 10})
            else:
                assert statuses == Counter({503: 10})
    finally:
        stop(pool)


def test_buffered_mode_routes_and_rewrites(bg: BackgroundLoop, tmp_path: Path,
                                           servers: list) -> None:
    pool = start_pool(bg, tmp_path, servers, mode="BUFFERED")
    try:
        r = httpx.post(pool.url(), content=b'{"model": "food-review", "prompt": "x"}')
        assert r.status_code == 200
        assert r.json()["model"] == "food-review"
        key = r.json()["seen_headers"]["x-gateway-destination-endpoint"]
        assert pool.by_key(key).requests[-1]["body"]["model"].startswith("food-review-v")
        body = b'{"model": "food-review", "prompt": "x", "stream": true}'
        with httpx.stream("POST", pool.url(), content=body) as s:
            events = [line for line in s.iter_lines() if line.startswith("data: {")]
        assert all(orjson.loads(ev[5:])["model"] == "food-review" for ev in events)
    finally:
        stop(pool)


def test_manifest_edits_apply_live_under_load_without_failures(
        bg: BackgroundLoop, tmp_path: Path) -> None:
    servers = start_servers(bg, 3)
    first_two = servers[:2]
    pool = start_pool(bg, tmp_path, first_two, gateway_knows=servers)
    statuses: Counter[int] = Counter()
    served: list[str] = []
    stop_load = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=10) as client:
            i = 0
            while not stop_load.is_set():
                i += 1
                r = client.post(pool.url(), content=orjson.dumps(
                    {"model": "food-review", "prompt": f"load {i}"}))
                statuses[r.status_code] += 1
                if r.status_code == 200:
                    served.append(r.json()["served_by"])

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        time.sleep(1)
        # add the third pod
        docs = pool_manifests("pool", [(s.name, s.host) for s in servers], servers[0].port,
                              [REWRITE, *OBJECTIVES])
        write_yaml(pool.manifests, docs)
        time.sleep(1.5)
        mark = len(served)
        time.sleep(1)
        assert servers[2].name in served[mark:]
        # remove the first pod and move the whole split to v2
        rewrite = orjson.loads(orjson.dumps(REWRITE))
        rewrite["spec"]["rules"][0]["targets"] = [{"modelRewrite": "food-review-v2",
                                                   "weight": 1}]
        docs = pool_manifests("pool", [(s.name, s.host) for s in servers[1:]],
                              servers[0].port, [rewrite, *OBJECTIVES])
        write_yaml(pool.manifests, docs)
        time.sleep(1.5)
        mark = len(served)
        before_v = sum(len(s.requests) for s in servers)
        time.sleep(1)
        assert servers[0].name not in served[mark:]
        recent = [r["body"]["model"] for s in servers[1:] for r in s.requests[-20:]]
        assert recent and set(recent) == {"food-review-v2"}
        assert sum(len(s.requests) for s in servers) > before_v
    finally:
        stop_load.set()
        for w in workers:
            w.join()
        stop(pool)
        for s in servers:
            bg.run(s.stop())
    assert set(statuses) == {200}, statuses
    assert sum(statuses.values()) > 50


def test_broken_manifest_edit_keeps_serving(bg: BackgroundLoop, tmp_path: Path,
                                            servers: list) -> None:
    pool = start_pool(bg, tmp_path, servers)
    try:
        pool.manifests.write_text("kind: InferencePool\nspec: [not, a, mapping\n")
        time.sleep(1.2)
        r = httpx.post(pool.url(), content=b'{"model": "base-model", "prompt": "x"}')
        assert r.status_code == 200
        assert "keeping the last good state" in pool.epp.log_tail(50)
    finally:
        stop(pool)


def test_simulator_fleet_served_with_the_default_profile(bg: BackgroundLoop,
                                                         tmp_path: Path) -> None:
    port = e.free_port()
    hosts = [f"127.0.2.{i + 1}" for i in range(4)]
    configs = [ServerConfig(host=h, port=port, name=f"sim-{i}", profile=TINY, time_scale=0.2)
               for i, h in enumerate(hosts)]

    async def enter() -> object:
        cm = start_fleet(configs)
        await cm.__aenter__()
        return cm

    fleet_cm = bg.run(enter())
    manifests = tmp_path / "pool.yaml"
    write_yaml(manifests, pool_manifests("sims", [(f"sim-{i}", h) for i, h in enumerate(hosts)],
                                         port))
    epp = EppProcess(manifests, log_path=tmp_path / "epp.log").wait_serving()
    admin, listen = e.free_port(), e.free_port()
    try:
        known = [f"{h}:{port}" for h in hosts]
        with e.Envoy(pool_gateway_config(epp.port, admin, listen, endpoints=known),
                     admin_port=admin):
            url = f"http://127.0.0.1:{listen}/v1/chat/completions"

            async def burst() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=30) as client:
                    return await asyncio.gather(*(client.post(url, content=orjson.dumps({
                        "model": "meta-llama/Llama-3.1-8B-Instruct", "max_tokens": 8,
                        "messages": [{"role": "user", "content": f"hello {i}"}]}))
                        for i in range(40)))

            responses = asyncio.run(burst())
        assert all(r.status_code == 200 for r in responses)
        pods = Counter(r.headers["x-inference-pod"] for r in responses)
        assert set(pods) == {f"sim-{i}" for i in range(4)}  # a burst spreads over the fleet
        assert all(r.json()["usage"]["completion_tokens"] == 8 for r in responses)
    finally:
        epp.stop()
        bg.run(fleet_cm.__aexit__(None, None, None))  # type: ignore[attr-defined]
