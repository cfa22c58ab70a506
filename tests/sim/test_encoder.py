"""The simulator's encode role (issue #29): the encoder's cost per image, its cache and the
metrics reporting it, and the EC shared-storage connector between encode and decode servers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from sim.encoder import ECTransferConfig, parse_ec_transfer_config
from sim.engine import Engine
from sim.openai import parse_request
from sim.profiles import TINY
from tests.support.sim import MODEL, FleetFactory, tiny

ENCODE = 0.05


def chat(*urls: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe"},
        *({"type": "image_url", "image_url": {"url": u}} for u in urls)]}]}


def step_seconds(engine: Engine, body: dict[str, Any], remote: frozenset[str] = frozenset()
                 ) -> float:

    parsed = parse_request(orjson.dumps(body), chat=True)
    req = engine.new_request(parsed.prompt, 1)
    req.mm_hashes, req.remote_mm = parsed.mm_hashes, remote
    engine.add(req)
    end = engine.begin_step(0.0)
    engine.finish_step()
    return end


def test_an_image_costs_encoder_time_once_then_hits_the_encoder_cache() -> None:
    engine = Engine(TINY.with_overrides({"encode_time_per_image": ENCODE}))
    text = step_seconds(engine, chat())
    two = step_seconds(engine, chat("https://x/a.png", "https://x/b.png"))
    assert engine.encoded_items_total == 2
    again = step_seconds(engine, chat("https://x/b.png", "https://x/a.png"))
    assert engine.mm_cache_queries_total == 4 and engine.mm_cache_hits_total == 2
    assert engine.encoded_items_total == 2
    # two encodes, plus the images' placeholder tokens (225 each) of prefill
    assert two - text > 2 * ENCODE
    assert again < two - 1.5 * ENCODE


def test_placeholders_make_an_image_count_its_tokens() -> None:

    parsed = parse_request(orjson.dumps(chat("https://x/a.png")), chat=True)
    bare = parse_request(orjson.dumps(chat()), chat=True)
    assert len(parsed.prompt) - len(bare.prompt) == 225 * 4
    assert len(parsed.mm_hashes) == 1


def test_an_item_an_encode_server_made_is_loaded_not_encoded() -> None:
    engine = Engine(TINY.with_overrides({"encode_time_per_image": ENCODE,
                                         "ec_load_time_per_image": 0.001}))
    body = chat("https://x/a.png")

    h = parse_request(orjson.dumps(body), chat=True).mm_hashes
    step_seconds(engine, body, remote=frozenset(h))
    assert engine.ec_loaded_items_total == 1 and engine.encoded_items_total == 0


def test_the_encoder_cache_is_an_lru_of_encoder_cache_items() -> None:
    engine = Engine(TINY.with_overrides({"encoder_cache_items": 1}))
    for url in ("https://x/a", "https://x/b", "https://x/a"):
        step_seconds(engine, chat(url))
    assert engine.encoded_items_total == 3  # a was evicted by b


def test_ec_config_is_validated() -> None:
    cfg = parse_ec_transfer_config({"ec_connector": "ECSharedStorageConnector",
                                    "ec_role": "ec_producer",
                                    "ec_connector_extra_config": {"shared_storage_path": "/t"}})
    assert cfg.produces and not cfg.consumes
    with pytest.raises(ValueError, match="ec_role"):
        parse_ec_transfer_config({"ec_role": "kv_both",
                                  "ec_connector_extra_config": {"shared_storage_path": "/t"}})
    with pytest.raises(ValueError, match="unknown key"):
        parse_ec_transfer_config({"ec_role": "ec_both", "nope": 1})
    with pytest.raises(ValueError, match="shared_storage_path"):
        parse_ec_transfer_config({"ec_role": "ec_both"})


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


async def test_encode_server_publishes_and_decode_server_loads(fleet_of: FleetFactory,
                                                               tmp_path: Path) -> None:
    producer = ECTransferConfig("ec_producer", tmp_path)
    consumer = ECTransferConfig("ec_consumer", tmp_path)
    slow = {"encode_time_per_image": 0.3}
    async with fleet_of(tiny(ec_transfer=producer, name="encode", **slow),
                        tiny(ec_transfer=consumer, name="decode", **slow)) as fleet, \
            httpx.AsyncClient(timeout=10) as client:
        e_url, d_url = fleet.urls
        one = chat("https://x/cat.png")
        r = await client.post(f"{e_url}/v1/chat/completions", json=one)
        assert r.status_code == 200, r.text
        assert len(list(tmp_path.iterdir())) == 1
        t0 = time.monotonic()
        r = await client.post(f"{d_url}/v1/chat/completions", json=one)
        assert r.status_code == 200, r.text
        assert time.monotonic() - t0 < 0.3  # loaded, not encoded again
        m = (await client.get(f"{d_url}/metrics")).text
        assert metric(m, "vllm:mm_cache_queries_total") == 1
        assert metric(m, "vllm:mm_cache_hits_total") == 0
        r = await client.post(f"{d_url}/v1/chat/completions", json=one)
        m = (await client.get(f"{d_url}/metrics")).text
        assert metric(m, "vllm:mm_cache_hits_total") == 1
