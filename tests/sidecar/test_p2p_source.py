"""``x-kv-cache-source-host-port`` (llm-d-router v0.10): the sidecar has the pod computing
the prompt pull the cached prefix from the named pool pod, here between real simulated
servers (the simulator serves the pull and counts what it read as external prefix hits)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from aiohttp import web

from epp.datastore import Datastore
from epp.sources import ManifestSource
from modelserver.pd import KV_SOURCE_HEADER, PREFILLER_HEADER
from sidecar.allowlist import PoolPrefillers
from sidecar.proxy import Sidecar, SidecarConfig, SidecarMetrics
from sim.fleet import Fleet, start_fleet
from tests.sidecar.test_sidecar import MODEL, PROMPT, _pod, _server, _sum, write_manifests

DECODE_IP, PREFILL_IP, SOURCE_IP = "127.0.0.1", "127.0.0.2", "127.0.0.6"
HITS = "vllm:external_prefix_cache_hits_total"


@contextlib.asynccontextmanager
async def stack(tmp_path: Path, *, p2p: bool = True,
                ) -> AsyncIterator[tuple[Fleet, Sidecar, str, httpx.AsyncClient]]:
    configs = [_server(DECODE_IP, "decode"), _server(PREFILL_IP, "prefill"),
               _server(SOURCE_IP, "source")]
    async with start_fleet(configs) as fleet, httpx.AsyncClient(timeout=20) as client:
        manifests = tmp_path / "pool.yaml"
        write_manifests(manifests, fleet.ports, [
            _pod("decode", DECODE_IP, "decode"), _pod("prefill", PREFILL_IP, "prefill"),
            _pod("source", SOURCE_IP, "decode")])
        datastore = Datastore()
        ManifestSource(manifests, datastore, pool_name="pd").load()
        sidecar = Sidecar(SidecarConfig(decoder_url=fleet.urls[0], prefill_timeout=5.0,
                                        enable_p2p_pull=p2p, p2p_connector_port=0),
                          PoolPrefillers(datastore), SidecarMetrics())
        runner = web.AppRunner(sidecar.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            # the source pod served this prompt before: its prefix cache holds it
            warm = await client.post(f"{fleet.urls[2]}/v1/completions", json={
                "model": MODEL, "prompt": PROMPT, "max_tokens": 1})
            assert warm.status_code == 200
            yield fleet, sidecar, f"http://127.0.0.1:{port}", client
        finally:
            await runner.cleanup()


def addr(fleet: Fleet, i: int) -> str:
    s = fleet.servers[i]
    return f"{s.cfg.host}:{s.port}"


async def hits(client: httpx.AsyncClient, fleet: Fleet, i: int) -> float:
    return _sum((await client.get(f"{fleet.urls[i]}/metrics")).text, HITS)


def outcome(sidecar: Sidecar, name: str) -> float:
    return sidecar.metrics.registry.get_sample_value(
        "pd_sidecar_kv_source_total", {"outcome": name}) or 0.0


async def complete(client: httpx.AsyncClient, url: str, headers: dict[str, str]
                   ) -> httpx.Response:
    return await client.post(f"{url}/v1/completions", headers=headers, json={
        "model": MODEL, "prompt": PROMPT, "max_tokens": 4})


async def test_the_decoder_pulls_the_cached_prefix_from_the_named_source(
        tmp_path: Path) -> None:
    async with stack(tmp_path) as (fleet, sidecar, url, client):
        r = await complete(client, url, {KV_SOURCE_HEADER: addr(fleet, 2)})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 150
        assert await hits(client, fleet, 0) > 150
        assert outcome(sidecar, "used") == 1


async def test_with_a_prefiller_the_prefill_leg_pulls_from_the_source(tmp_path: Path) -> None:
    async with stack(tmp_path) as (fleet, sidecar, url, client):
        r = await complete(client, url, {PREFILLER_HEADER: addr(fleet, 1),
                                         KV_SOURCE_HEADER: addr(fleet, 2)})
        assert r.status_code == 200, r.text
        assert await hits(client, fleet, 1) > 150  # the prefiller read the source's cache
        assert outcome(sidecar, "used") == 1


async def test_sources_outside_the_pool_malformed_or_with_pulls_off_are_ignored(
        tmp_path: Path) -> None:
    async with stack(tmp_path) as (fleet, sidecar, url, client):
        for value, why in (("10.9.9.9:8000", "ignored_not_allowed"),
                           ("no-port", "ignored_malformed")):
            r = await complete(client, url, {KV_SOURCE_HEADER: value})
            assert r.status_code == 200
            assert outcome(sidecar, why) == 1
        assert await hits(client, fleet, 0) == 0
    async with stack(tmp_path, p2p=False) as (fleet, sidecar, url, client):
        r = await complete(client, url, {KV_SOURCE_HEADER: addr(fleet, 2)})
        assert r.status_code == 200
        assert await hits(client, fleet, 0) == 0
        assert outcome(sidecar, "ignored_p2p_off") == 1
