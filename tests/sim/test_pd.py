"""Prefill/decode roles of the simulator over real HTTP (NixlConnector-shaped protocol)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import httpx
import orjson
import pytest

from modelserver.pd import RemotePrefill, prefill_leg_body
from sim.engine import Engine
from sim.pd import LINKS, KVTransferConfig, parse_kv_transfer_config
from sim.profiles import TINY
from tests.support.sim import MODEL, FleetFactory, tiny

PROMPT = "abcd" * 200  # 200 tokens, 12.5 blocks of 16
BOTH = KVTransferConfig(kv_role="kv_both", abort_timeout=60.0)


def metric(text: str, name: str) -> float:
    """Sum of one metric's samples in a Prometheus exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def prefill(client: httpx.AsyncClient, url: str, prompt: str = PROMPT) -> dict[str, Any]:
    body = prefill_leg_body({"model": MODEL, "prompt": prompt, "max_tokens": 20,
                             "stream": True, "stream_options": {"include_usage": True}})
    r = await client.post(f"{url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def state(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    data: dict[str, Any] = (await client.get(f"{url}/sim/state")).json()
    return data


def pd_pair(fleet_of: FleetFactory, **kv: Any) -> Any:
    """A prefill and a decode server, both ``kv_both`` (as llm-d deploys NixlConnector)."""
    cfg = KVTransferConfig(**{"kv_role": "kv_both", "abort_timeout": 60.0, **kv})
    return fleet_of(tiny(kv_transfer=cfg, name="prefill"), tiny(kv_transfer=cfg, name="decode"))


async def test_prefill_leg_answers_one_token_and_returns_nixl_params_while_holding_kv(
    fleet_of: FleetFactory,
) -> None:
    async with pd_pair(fleet_of) as fleet, httpx.AsyncClient(timeout=10) as client:
        p_url = fleet.urls[0]
        body = await prefill(client, p_url)
        assert body["usage"]["completion_tokens"] == 1
        params = body["kv_transfer_params"]
        remote = RemotePrefill.from_json(params)
        assert params["do_remote_decode"] is False
        assert (remote.remote_host, remote.remote_port) == ("127.0.0.1", fleet.ports[0])
        assert len(remote.remote_block_ids) == 13  # 201 tokens of KV in blocks of 16
        st = await state(client, p_url)
        assert st["running"] == 0 and st["kv_cache_usage"] > 0  # finished, KV still held


async def test_decode_leg_pulls_the_kv_then_decodes_without_recomputing_the_prompt(
    fleet_of: FleetFactory,
) -> None:
    async with pd_pair(fleet_of) as fleet, httpx.AsyncClient(timeout=10) as client:
        p_url, d_url = fleet.urls
        params = (await prefill(client, p_url))["kv_transfer_params"]
        r = await client.post(f"{d_url}/v1/completions", json={
            "model": MODEL, "prompt": PROMPT, "max_tokens": 20, "kv_transfer_params": params})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 20
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 199
        assert (await state(client, p_url))["kv_cache_usage"] == 0  # pulled: freed
        m = (await client.get(f"{d_url}/metrics")).text
        assert metric(m, "vllm:external_prefix_cache_hits_total") == 199
        assert metric(m, "vllm:prefix_cache_hits_total") == 0
        assert metric(m, "vllm:nixl_xfer_time_seconds_count") == 1
        assert metric(m, "vllm:nixl_bytes_transferred_sum") == 200 * BOTH.kv_bytes_per_token
        assert metric(m, "vllm:nixl_num_failed_transfers_total") == 0


async def test_streaming_decode_leg_streams_every_token(fleet_of: FleetFactory) -> None:
    async with pd_pair(fleet_of) as fleet, httpx.AsyncClient(timeout=10) as client:
        p_url, d_url = fleet.urls
        params = (await prefill(client, p_url))["kv_transfer_params"]
        r = await client.post(f"{d_url}/v1/completions", json={
            "model": MODEL, "prompt": PROMPT, "max_tokens": 6, "stream": True,
            "kv_transfer_params": params})
        events = [e for e in r.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert len(events) == 7
        m = (await client.get(f"{d_url}/metrics")).text
        assert metric(m, "vllm:external_prefix_cache_hits_total") == 199


async def test_kv_can_be_pulled_once(fleet_of: FleetFactory) -> None:
    async with pd_pair(fleet_of) as fleet, httpx.AsyncClient(timeout=10) as client:
        p_url = fleet.urls[0]
        params = (await prefill(client, p_url))["kv_transfer_params"]
        pull = {"remote_engine_id": params["remote_engine_id"],
                "remote_request_id": params["remote_request_id"]}
        assert (await client.post(f"{p_url}/sim/kv/pull", json=pull)).status_code == 200
        again = await client.post(f"{p_url}/sim/kv/pull", json=pull)
        assert again.status_code == 404
        assert again.json()["error"]["code"] == 404


async def test_concurrent_pulls_of_one_kv_get_it_once(fleet_of: FleetFactory) -> None:
    # A slow link (26 MB over 50 MB/s) keeps one read in flight while the other arrives.
    async with pd_pair(fleet_of, bandwidth=50e6) as fleet, \
            httpx.AsyncClient(timeout=10) as client:
        p_url = fleet.urls[0]
        params = (await prefill(client, p_url))["kv_transfer_params"]
        pull = {"remote_engine_id": params["remote_engine_id"],
                "remote_request_id": params["remote_request_id"]}
        answers = await asyncio.gather(*(client.post(f"{p_url}/sim/kv/pull", json=pull)
                                         for _ in range(2)))
        assert sorted(a.status_code for a in answers) == [200, 404]
        st = await state(client, p_url)
        assert st["kv_held"] == 0 and st["kv_pulls_served"] == 1


async def test_pull_for_another_engine_is_refused(fleet_of: FleetFactory) -> None:
    async with pd_pair(fleet_of) as fleet, httpx.AsyncClient(timeout=10) as client:
        p_url = fleet.urls[0]
        params = (await prefill(client, p_url))["kv_transfer_params"]
        r = await client.post(f"{p_url}/sim/kv/pull", json={
            "remote_engine_id": "someone-else", "remote_request_id": params["remote_request_id"]})
        assert r.status_code == 404
        bad = await client.post(f"{p_url}/sim/kv/pull", content=b"{nope")
        assert bad.status_code == 400


async def test_dead_prefiller_means_local_recompute_and_a_counted_failure(
    fleet_of: FleetFactory,
) -> None:
    async with pd_pair(fleet_of) as fleet, httpx.AsyncClient(timeout=10) as client:
        p_url, d_url = fleet.urls
        params = (await prefill(client, p_url))["kv_transfer_params"]
        await fleet.kill(fleet.ports[0])
        r = await client.post(f"{d_url}/v1/completions", json={
            "model": MODEL, "prompt": PROMPT, "max_tokens": 5, "kv_transfer_params": params})
        assert r.status_code == 200
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        m = (await client.get(f"{d_url}/metrics")).text
        assert metric(m, "vllm:nixl_num_failed_transfers_total") == 1
        assert metric(m, "vllm:external_prefix_cache_hits_total") == 0


async def test_params_for_another_prompt_load_only_the_shared_blocks(
    fleet_of: FleetFactory,
) -> None:
    async with pd_pair(fleet_of) as fleet, httpx.AsyncClient(timeout=10) as client:
        p_url, d_url = fleet.urls
        params = (await prefill(client, p_url))["kv_transfer_params"]
        other = "abcd" * 64 + "wxyz" * 136  # shares the first 4 blocks
        r = await client.post(f"{d_url}/v1/completions", json={
            "model": MODEL, "prompt": other, "max_tokens": 2, "kv_transfer_params": params})
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 64


async def test_malformed_kv_transfer_params(fleet_of: FleetFactory) -> None:
    async with pd_pair(fleet_of) as fleet, httpx.AsyncClient(timeout=10) as client:
        d_url = fleet.urls[1]
        r = await client.post(f"{d_url}/v1/completions", json={
            "model": MODEL, "prompt": PROMPT, "kv_transfer_params": [1, 2]})
        assert r.status_code == 400
        assert "kv_transfer_params" in r.json()["error"]["message"]
        # The right type but not the NixlConnector shape: counted, prompt recomputed.
        r = await client.post(f"{d_url}/v1/completions", json={
            "model": MODEL, "prompt": PROMPT, "max_tokens": 2,
            "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "127.0.0.1"}})
        assert r.status_code == 200
        m = (await client.get(f"{d_url}/metrics")).text
        assert metric(m, "vllm:nixl_num_failed_transfers_total") == 1


async def test_held_kv_expires_when_no_decoder_comes(fleet_of: FleetFactory) -> None:
    async with pd_pair(fleet_of, abort_timeout=0.05) as fleet, \
            httpx.AsyncClient(timeout=10) as client:
        p_url = fleet.urls[0]
        await prefill(client, p_url)
        for _ in range(200):
            if (await state(client, p_url))["kv_cache_usage"] == 0:
                break
            await asyncio.sleep(0.02)
        m = (await client.get(f"{p_url}/metrics")).text
        assert metric(m, "vllm:nixl_num_kv_expired_reqs_total") == 1
        assert (await state(client, p_url))["kv_cache_usage"] == 0


async def test_server_without_connector_ignores_kv_transfer_params(
    fleet_of: FleetFactory,
) -> None:
    async with fleet_of(tiny()) as fleet, httpx.AsyncClient(timeout=10) as client:
        url = fleet.urls[0]
        body = await prefill(client, url)
        assert "kv_transfer_params" not in body
        assert (await state(client, url))["kv_cache_usage"] == 0
        assert (await client.post(f"{url}/sim/kv/pull", json={})).status_code == 404
        assert "nixl" not in (await client.get(f"{url}/metrics")).text


async def test_a_consumer_only_server_runs_a_prefill_leg_as_a_normal_request(
    fleet_of: FleetFactory,
) -> None:
    cfg = KVTransferConfig(kv_role="kv_consumer")
    async with fleet_of(tiny(kv_transfer=cfg)) as fleet, httpx.AsyncClient(timeout=10) as client:
        body = await prefill(client, fleet.urls[0])
        assert "kv_transfer_params" not in body
        assert (await state(client, fleet.urls[0]))["kv_cache_usage"] == 0


def test_remote_prefilled_request_is_charged_one_token_and_no_prefill_overhead() -> None:
    local, remote = Engine(TINY), Engine(TINY)
    a = local.new_request(PROMPT.encode(), 4)
    b = remote.new_request(PROMPT.encode(), 4)
    b.remote_tokens = 200
    local.add(a)
    remote.add(b)
    factor = 1 + (TINY.load_factor - 1) / TINY.max_num_seqs
    assert local.begin_step(0.0) == pytest.approx(
        factor * (TINY.prefill_overhead + 200 * TINY.prefill_time_per_token))
    assert remote.begin_step(0.0) == pytest.approx(factor * TINY.prefill_time_per_token)
    assert remote.external_hits_total == 199 and remote.prefix_hits_total == 0


def test_transfer_time_is_latency_plus_bytes_over_bandwidth() -> None:
    rdma = parse_kv_transfer_config({"kv_role": "kv_both", "link": "rdma"})
    tcp = parse_kv_transfer_config({"kv_role": "kv_both", "link": "tcp"})
    custom = parse_kv_transfer_config({"bandwidth": 10, "latency": 1,
                                       "kv_bytes_per_token": 1000})
    assert (rdma.bandwidth, rdma.latency) == LINKS["rdma"]
    tokens = 8192
    assert rdma.transfer_seconds(tokens) == pytest.approx(
        LINKS["rdma"][1] + tokens * 131072 / LINKS["rdma"][0])
    assert tcp.transfer_seconds(tokens) > 10 * rdma.transfer_seconds(tokens)
    assert custom.transfer_seconds(10_000) == pytest.approx(0.001 + 10_000 * 1000 / 10e9)


@pytest.mark.parametrize(("config", "message"), [
    ({"kv_role": "kv_both", "colour": 1}, "unknown key(s) colour"),
    ({"kv_role": "prefill"}, "kv_role must be one of"),
    ({"kv_connector": "LMCacheConnectorV1"}, "kv_connector must be one of"),
    ({"link": "carrier-pigeon"}, "link must be one of"),
    ({"bandwidth": 0}, "bandwidth (GB/s) must be positive"),
    ({"kv_bytes_per_token": "big"}, "kv_bytes_per_token must be a positive integer"),
    ([], "must be a JSON object"),
])
def test_bad_kv_transfer_config_is_named(config: Any, message: str) -> None:
    with pytest.raises(ValueError, match=r".*") as info:
        parse_kv_transfer_config(config)
    assert message in str(info.value)


def test_cli_bad_kv_transfer_config_exits_with_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "sim.main", "--kv-transfer-config",
                        '{"kv_role": "kv_both", "linkk": "rdma"}'],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "vllm-sim: error: --kv-transfer-config: unknown key(s) linkk"]
    r = subprocess.run([sys.executable, "-m", "sim.main", "--kv-transfer-config", "{"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "not valid JSON" in r.stderr


def test_config_file_sets_the_role_per_server(tmp_path: Any) -> None:
    from sim.config import ServerConfig, load_config_file

    f = tmp_path / "fleet.yaml"
    f.write_text(orjson.dumps({"servers": [
        {"port": 1, "kv_transfer_config": {"kv_role": "kv_producer", "link": "tcp"}},
        {"port": 2}]}).decode())
    servers = load_config_file(f, ServerConfig())
    assert servers[0].kv_transfer is not None
    assert servers[0].kv_transfer.kv_role == "kv_producer"
    assert servers[0].kv_transfer.bandwidth == LINKS["tcp"][0]
    assert servers[1].kv_transfer is None
    f.write_text(orjson.dumps({"servers": [{"port": 1, "kv_transfer_config": {"x": 1}}]}
                              ).decode())
    with pytest.raises(ValueError, match="kv_transfer_config: unknown key"):
        load_config_file(f, ServerConfig())

