"""``/metrics`` parses with prometheus-client and reflects the engine."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.sim import MODEL, FleetFactory, tiny


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(parsed: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    (_, v), = parsed[name]
    return v


async def test_vllm_gauges_match_engine_state_under_load(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(max_num_seqs=2, time_scale=5.0)) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        engine = fleet.servers[0].engine
        tasks = [asyncio.create_task(client.post(
            "/v1/completions", json={"prompt": f"{i}" * 100, "max_tokens": 200}))
            for i in range(5)]
        for _ in range(200):
            if engine.num_running == 2 and engine.num_waiting == 3:
                break
            await asyncio.sleep(0.005)
        parsed = samples((await client.get("/metrics")).text)
        assert value(parsed, "vllm:num_requests_running") == 2
        assert value(parsed, "vllm:num_requests_waiting") == 3
        usage = value(parsed, "vllm:kv_cache_usage_perc")
        assert 0 < usage <= 1 and abs(usage - engine.kv.usage) < 0.05
        labels, _ = parsed["vllm:num_requests_running"][0]
        assert labels == {"model_name": MODEL, "engine": "0"}  # vLLM's labels (0.32)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_cache_config_and_lora_info_labels(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(lora_modules={"sql": "/p"}, time_scale=5.0)) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        task = asyncio.create_task(client.post(
            "/v1/completions", json={"model": "sql", "prompt": "x", "max_tokens": 300}))
        engine = fleet.servers[0].engine
        for _ in range(200):
            if engine.num_running:
                break
            await asyncio.sleep(0.005)
        parsed = samples((await client.get("/metrics")).text)
        (cfg_labels, cfg_value), = parsed["vllm:cache_config_info"]
        assert cfg_labels["block_size"] == "16" and cfg_labels["num_gpu_blocks"] == "256"
        assert cfg_value == 1
        (lora_labels, stamp), = parsed["vllm:lora_requests_info"]
        assert lora_labels["max_lora"] == "2"
        assert lora_labels["running_lora_adapters"] == "sql"
        assert lora_labels["waiting_lora_adapters"] == ""
        assert stamp > 1.7e9  # a unix timestamp
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_lora_info_absent_until_the_first_step_then_keeps_every_state(
        fleet_of: FleetFactory) -> None:
    """vLLM 0.32: no lora_requests_info sample before the engine has stepped; afterwards
    every label set seen stays on the page, the current one with the largest value."""
    async with fleet_of(tiny(lora_modules={"sql": "/p"}, time_scale=5.0)) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        fresh = (await client.get("/metrics")).text
        assert "# TYPE vllm:lora_requests_info gauge" in fresh
        assert "vllm:lora_requests_info" not in samples(fresh)
        task = asyncio.create_task(client.post(
            "/v1/completions", json={"model": "sql", "prompt": "x", "max_tokens": 20}))
        engine = fleet.servers[0].engine
        for _ in range(400):
            if engine.num_running:
                break
            await asyncio.sleep(0.005)
        busy = samples((await client.get("/metrics")).text)["vllm:lora_requests_info"]
        assert [labels["running_lora_adapters"] for labels, _ in busy] == ["sql"]
        assert (await task).status_code == 200
        after = samples((await client.get("/metrics")).text)["vllm:lora_requests_info"]
        assert len(after) == 2
        newest, _ = max(after, key=lambda s: s[1])
        assert newest["running_lora_adapters"] == "" and newest["max_lora"] == "2"


async def test_request_success_by_finish_reason_and_vllm_histogram_names(
        fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny()) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.json()["choices"][0]["finish_reason"] == "length"
        parsed = samples((await client.get("/metrics")).text)
        by_reason = {labels["finished_reason"]: v
                     for labels, v in parsed["vllm:request_success_total"]}
        assert by_reason == {"stop": 0, "length": 1, "abort": 0, "error": 0, "repetition": 0}
        assert value(parsed, "vllm:request_time_per_output_token_seconds_count") == 1
        assert "vllm:time_per_output_token_seconds_count" not in parsed
        (cfg_labels, _), = parsed["vllm:cache_config_info"]
        assert cfg_labels["engine"] == "0"


async def test_counters_and_histograms_after_requests(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny()) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        prompt = "shared prefix " * 20  # 280 bytes = 70 tokens = 4 full blocks
        for _ in range(2):
            r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4})
            assert r.status_code == 200
        parsed = samples((await client.get("/metrics")).text)
        assert value(parsed, "vllm:prompt_tokens_total") == 140
        assert value(parsed, "vllm:generation_tokens_total") == 8
        assert value(parsed, "vllm:prefix_cache_queries_total") == 140
        assert value(parsed, "vllm:prefix_cache_hits_total") == 64
        assert value(parsed, "vllm:time_to_first_token_seconds_count") == 2
        assert value(parsed, "vllm:inter_token_latency_seconds_count") == 6
        assert value(parsed, "vllm:e2e_request_latency_seconds_count") == 2
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 64


async def test_gpu_cache_usage_metric_behind_flag(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(gpu_cache_usage_metric=True), tiny()) as fleet, \
            httpx.AsyncClient(timeout=10) as client:
        with_flag = samples((await client.get(fleet.urls[0] + "/metrics")).text)
        without = samples((await client.get(fleet.urls[1] + "/metrics")).text)
        assert "vllm:gpu_cache_usage_perc" in with_flag
        assert "vllm:gpu_cache_usage_perc" not in without
        assert "vllm:kv_cache_usage_perc" in without


async def test_sglang_and_trtllm_dialects_use_their_names(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(engine="sglang"), tiny(engine="trtllm-serve")) as fleet, \
            httpx.AsyncClient(timeout=10) as client:
        sg = samples((await client.get(fleet.urls[0] + "/metrics")).text)
        trt = samples((await client.get(fleet.urls[1] + "/metrics")).text)
    for name in ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"):
        assert name in sg
    (labels, _), = sg["sglang:cache_config_info"]
    assert labels == {"page_size": "16", "num_pages": "256"}
    assert not any(n.startswith("vllm:") for n in sg)
    for name in ("trtllm_num_requests_waiting", "trtllm_num_requests_running",
                 "trtllm_kv_cache_utilization"):
        assert name in trt
