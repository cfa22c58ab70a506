"""Fleets in one process, fault injection, kill and revive."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from sim.config import Faults
from tests.support.sim import FleetFactory, tiny


async def test_eight_servers_each_answer_with_their_own_port(fleet_of: FleetFactory) -> None:
    async with fleet_of(*[tiny(seed=i) for i in range(8)]) as fleet, \
            httpx.AsyncClient(timeout=10) as client:
        assert len(set(fleet.ports)) == 8
        rs = await asyncio.gather(*(client.post(url + "/v1/completions",
                                                json={"prompt": "x", "max_tokens": 2})
                                    for url in fleet.urls))
        assert [int(r.headers["x-inference-port"]) for r in rs] == fleet.ports
        assert all(s.engine.finished_total == 1 for s in fleet.servers)


async def test_error_rate_one_answers_500(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(faults=Faults(error_rate=1.0))) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0]) as client:
        for _ in range(3):
            r = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
            assert r.status_code == 500
            assert r.json()["error"]["type"] == "InternalServerError"
            assert r.headers["x-inference-port"] == str(fleet.ports[0])


async def test_faults_can_be_flipped_live(server: tuple) -> None:
    _, client = server
    r = await client.post("/sim/faults", json={"error_rate": 1.0, "error_status": 503})
    assert r.json()["error_rate"] == 1.0
    assert (await client.post("/v1/completions", json={"prompt": "x"})).status_code == 503
    await client.post("/sim/faults", json={"error_rate": 0.0})
    assert (await client.post("/v1/completions", json={"prompt": "x"})).status_code == 200
    bad = await client.post("/sim/faults", json={"error_rate": 2})
    assert bad.status_code == 400


async def test_hang_mode_never_answers(server: tuple) -> None:
    _, client = server
    await client.post("/sim/faults", json={"hang": True})
    with pytest.raises(httpx.ReadTimeout):
        await client.post("/v1/completions", json={"prompt": "x"}, timeout=0.3)
    assert (await client.get("/health")).status_code == 200  # only inference hangs


async def test_metrics_hang_and_delay(server: tuple) -> None:
    _, client = server
    await client.post("/sim/faults", json={"metrics_hang": True})
    with pytest.raises(httpx.ReadTimeout):
        await client.get("/metrics", timeout=0.3)
    await client.post("/sim/faults", json={"metrics_hang": False, "metrics_delay": 0.2})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert (await client.get("/metrics")).status_code == 200
    assert loop.time() - t0 >= 0.2


async def test_added_latency_delays_answer(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(faults=Faults(added_latency=0.2))) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0]) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert loop.time() - t0 >= 0.2


async def test_kill_stops_listener_and_revive_brings_it_back(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(), tiny()) as fleet, httpx.AsyncClient(timeout=2) as client:
        a, b = fleet.urls
        port_a = fleet.ports[0]
        r = await client.post(a + "/sim/kill", json={})
        assert r.status_code == 200
        await asyncio.sleep(0.1)
        with pytest.raises(httpx.ConnectError):
            await client.get(a + "/health")
        r = await client.post(b + "/sim/revive", json={"port": port_a})
        assert r.json() == {"revived": port_a}
        ok = await client.get(a + "/health")
        assert ok.status_code == 200 and ok.headers["x-inference-port"] == str(port_a)


async def test_kill_drops_in_flight_stream(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(time_scale=5.0)) as fleet, httpx.AsyncClient(timeout=5) as client:
        async def stream() -> str:
            async with client.stream("POST", fleet.urls[0] + "/v1/completions", json={
                    "prompt": "x", "max_tokens": 1000, "stream": True}) as resp:
                return "".join([t async for t in resp.aiter_text()])

        task = asyncio.create_task(stream())
        await asyncio.sleep(0.2)
        await fleet.kill(fleet.ports[0])
        try:
            body = await task
        except httpx.HTTPError:
            body = ""
        assert "[DONE]" not in body
        assert fleet.servers[0].engine.num_running == 0


async def test_kill_after_and_revive_after_from_config(fleet_of: FleetFactory) -> None:
    cfg = tiny(faults=Faults(kill_after=0.1, revive_after=0.3))
    async with fleet_of(cfg) as fleet, httpx.AsyncClient(timeout=1) as client:
        url = fleet.urls[0] + "/health"
        assert (await client.get(url)).status_code == 200
        await asyncio.sleep(0.2)
        with pytest.raises(httpx.ConnectError):
            await client.get(url)
        await asyncio.sleep(0.35)
        assert (await client.get(url)).status_code == 200


async def test_server_killed_mid_step_serves_again_after_revive(fleet_of: FleetFactory) -> None:
    # Killing while the engine is inside a step used to end the engine loop, so the revived
    # server accepted requests and never answered them.
    async with fleet_of(tiny(time_scale=5.0)) as fleet, httpx.AsyncClient(timeout=5) as client:
        url = fleet.urls[0] + "/v1/completions"

        async def stream() -> None:
            with contextlib.suppress(httpx.HTTPError):
                async with client.stream("POST", url, json={
                        "prompt": "x", "max_tokens": 1000, "stream": True}) as resp:
                    async for _ in resp.aiter_bytes():
                        pass

        task = asyncio.create_task(stream())
        await asyncio.sleep(0.2)  # the engine is stepping the stream now
        await fleet.kill(fleet.ports[0])
        await task
        await fleet.revive(fleet.ports[0])
        r = await client.post(url, json={"prompt": "again", "max_tokens": 2})
        assert r.status_code == 200
        assert r.json()["usage"]["completion_tokens"] == 2
