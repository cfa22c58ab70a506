"""The simulator publishes vLLM's KV events over real ZMQ sockets (``--kv-events-config``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator

import httpx
import pytest
import zmq
import zmq.asyncio

from modelserver.kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_batch,
    parse_message,
    parse_replay_reply,
    replay_request,
)
from sim.fleet import Fleet, start_fleet
from sim.kvevents import BlockHasher, KVEventsConfig, external
from sim.main import build_parser, configs_from_args
from sim.tokenizer import token_ids
from tests.support.sim import tiny

KV = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:*",
                    replay_endpoint="tcp://127.0.0.1:*", topic="kv@{name}@{model}")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with start_fleet([tiny(kv_events=KV, num_gpu_blocks=8, time_scale=0.05)]) as f:
        yield f


async def subscribe(fleet: Fleet) -> zmq.asyncio.Socket:
    """A SUB socket that provably receives: wait for one published batch to arrive."""
    sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(b"")
    pub = fleet.servers[0].kv_publisher
    assert pub is not None
    sub.connect(pub.endpoint)
    async with httpx.AsyncClient(base_url=fleet.urls[0]) as c:
        for _ in range(200):  # ZMQ's slow joiner: retry until a batch gets through
            await c.post("/reset_prefix_cache")
            if await sub.poll(50):
                await sub.recv_multipart()
                while await sub.poll(20):
                    await sub.recv_multipart()
                return sub
    raise AssertionError("subscriber never received a batch")


async def next_batch(sub: zmq.asyncio.Socket) -> tuple[bytes, int, EventBatch]:
    assert await sub.poll(5000), "no batch within 5 s"
    topic, seq, payload = parse_message(await sub.recv_multipart())
    return topic, seq, decode_batch(payload)


async def complete(fleet: Fleet, prompt: str, **extra: object) -> None:
    async with httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as c:
        r = await c.post("/v1/completions",
                         json={"model": MODEL, "prompt": prompt, "max_tokens": 2, **extra})
        assert r.status_code == 200, r.text


async def test_prompt_blocks_are_published_as_block_stored_with_vllm_hashes(fleet: Fleet) -> None:
    sub = await subscribe(fleet)
    prompt = "the quick brown fox " * 4  # 80 bytes = 20 tokens: one full block of 16
    await complete(fleet, prompt)
    topic, _, batch = await next_batch(sub)
    server = fleet.servers[0]
    assert topic == f"kv@{server.name}@{MODEL}".encode()
    (ev,) = batch.events
    assert isinstance(ev, BlockStored)
    ids = token_ids(prompt.encode())
    assert ev.token_ids == ids[:16] and ev.block_size == 16 and ev.parent_block_hash is None
    want = [external(h) for h in BlockHasher("sha256").block_hashes(ids, 16)]
    assert ev.block_hashes == want and ev.medium == "GPU"
    assert batch.data_parallel_rank == 0
    sub.close()


async def test_eviction_is_published_as_block_removed(fleet: Fleet) -> None:
    sub = await subscribe(fleet)
    first = "a" * 260  # 65 tokens: 4 full blocks (5 held while running)
    await complete(fleet, first)
    _, _, stored = await next_batch(sub)
    (ev,) = stored.events
    assert isinstance(ev, BlockStored)
    await complete(fleet, "b" * 480)  # 120 tokens need all 8 blocks: evicts the first prompt
    _, _, batch = await next_batch(sub)
    removed = [h for e in batch.events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert sorted(removed) == sorted(ev.block_hashes)
    assert isinstance(batch.events[-1], BlockStored)  # vLLM order: evict, then store
    sub.close()


async def test_reset_prefix_cache_publishes_all_blocks_cleared(fleet: Fleet) -> None:
    sub = await subscribe(fleet)
    await complete(fleet, "c" * 100)
    await next_batch(sub)
    async with httpx.AsyncClient(base_url=fleet.urls[0]) as c:
        r = await c.post("/reset_prefix_cache")
    assert r.json() == {"reset": True}
    _, _, batch = await next_batch(sub)
    assert batch.events == [AllBlocksCleared()]
    assert fleet.servers[0].engine.kv.num_cached == 0
    sub.close()


async def test_lora_blocks_carry_the_adapter_and_hash_with_its_extra_keys() -> None:
    cfg = tiny(kv_events=KV, lora_modules={"sql-lora": "/adapters/sql"}, time_scale=0.05)
    async with start_fleet([cfg]) as fleet:
        sub = await subscribe(fleet)
        prompt = "select * from t; " * 4
        async with httpx.AsyncClient(base_url=fleet.urls[0]) as c:
            r = await c.post("/v1/completions", json={"model": "sql-lora", "prompt": prompt,
                                                      "max_tokens": 1, "cache_salt": "s1"})
            assert r.status_code == 200
        _, _, batch = await next_batch(sub)
        (ev,) = batch.events
        assert isinstance(ev, BlockStored)
        assert ev.lora_name == "sql-lora" and ev.lora_id == 1
        assert ev.extra_keys == [["sql-lora", "s1"]]
        ids = token_ids(prompt.encode())
        want = BlockHasher("sha256").block_hashes(ids, 16, lora=("sql-lora", "/adapters/sql"),
                                                  cache_salt="s1")
        assert ev.block_hashes == [external(h) for h in want]
        sub.close()


async def test_replay_socket_answers_buffered_batches_from_a_sequence(fleet: Fleet) -> None:
    sub = await subscribe(fleet)
    for p in ("d" * 70, "e" * 70):
        await complete(fleet, p)
        await next_batch(sub)
    pub = fleet.servers[0].kv_publisher
    assert pub is not None and pub.replay_endpoint is not None
    dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(pub.replay_endpoint)
    await dealer.send_multipart(replay_request(1))
    got = []
    while True:
        assert await dealer.poll(5000)
        item = parse_replay_reply(await dealer.recv_multipart())
        if item is None:
            break
        got.append(item[0])
    assert got == list(range(1, pub._seq))
    dealer.close()
    sub.close()


async def test_a_revived_server_publishes_again_from_sequence_zero(fleet: Fleet) -> None:
    server = fleet.servers[0]
    pub = server.kv_publisher
    assert pub is not None
    endpoint = pub.endpoint
    await complete(fleet, "f" * 70)
    assert pub._seq > 0
    await fleet.kill(server.port)
    await fleet.revive(server.port)
    assert pub.endpoint == endpoint and pub._seq == 0
    sub = await subscribe(fleet)  # its probe batches start the new sequence
    await complete(fleet, "g" * 70)
    _, seq, _ = await next_batch(sub)
    assert seq == pub._seq - 1  # published on the same endpoint, on the new sequence
    sub.close()


def test_block_hashes_match_vllm_0_32_known_answers() -> None:
    """Vectors computed with vLLM 0.32's own ``vllm.utils.hashing`` functions."""
    toks = list(range(100, 132))
    want = {
        "sha256": (0xD1ECDF87C874FD55, 0x2E94951059393917),
        "sha256_cbor": (0x90BA7482F31901BC, 0x706E1A9C55F39878),
        "xxhash": (0x56ABBED5BFC4763A, 0xF417F9E5EDB91D81),
        "xxhash_cbor": (0x3F54DE3E3A6063AB, 0x927EC97AC3138D4F),
    }
    lora_want = {
        "sha256": (0x7E9ABA21D826E3D6, 0xB9A74B700AF944E3),
        "sha256_cbor": (0x24F91617FFB83758, 0x49479598610574F),
    }
    for algo, expected in want.items():
        seed = None if algo.startswith("sha256") else "42"  # xxhash: PYTHONHASHSEED=42
        hasher = BlockHasher(algo, seed=seed)
        assert tuple(external(h) for h in hasher.block_hashes(toks, 16)) == expected, algo
        if algo in lora_want:
            got = hasher.block_hashes(toks, 16, lora=("sql", "/a/sql"), cache_salt="s1")
            assert tuple(external(h) for h in got) == lora_want[algo], algo


def test_kv_events_config_is_vllms_and_strict() -> None:
    cfg = KVEventsConfig.from_json('{"enable_kv_cache_events": true, "topic": "kv"}')
    assert (cfg.publisher, cfg.endpoint, cfg.buffer_steps, cfg.active) == \
        ("zmq", "tcp://*:5557", 10_000, True)
    assert not KVEventsConfig.from_json("{}").active
    for bad, msg in [('{"endpont": "x"}', "unknown field"), ("[1]", "JSON object"),
                     ('{"hwm": "big"}', "wrong type"), ('{"buffer_steps": 0}', "positive"),
                     ('{"publisher": "kafka"}', "unknown publisher"), ("{", "not valid JSON")]:
        with pytest.raises(ValueError, match=msg):
            KVEventsConfig.from_json(bad)


def test_fixed_endpoint_ports_are_offset_per_server_like_dp_ranks() -> None:
    cfgs = configs_from_args(build_parser().parse_args([
        "--ports", "8001-8003", "--kv-events-config",
        '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557",'
        ' "replay_endpoint": "tcp://*:5600"}']))
    assert [c.kv_events.endpoint for c in cfgs if c.kv_events] == \
        ["tcp://*:5557", "tcp://*:5558", "tcp://*:5559"]
    assert [c.kv_events.replay_endpoint for c in cfgs if c.kv_events] == \
        ["tcp://*:5600", "tcp://*:5601", "tcp://*:5602"]


def test_a_connect_endpoint_is_shared_by_every_server_of_the_process() -> None:
    cfgs = configs_from_args(build_parser().parse_args([
        "--ports", "8001-8002", "--kv-events-config",
        '{"enable_kv_cache_events": true, "endpoint": "tcp://10.0.0.9:5557",'
        ' "replay_endpoint": "tcp://*:5600"}']))
    assert [c.kv_events.endpoint for c in cfgs if c.kv_events] == ["tcp://10.0.0.9:5557"] * 2
    assert [c.kv_events.replay_endpoint for c in cfgs if c.kv_events] == \
        ["tcp://*:5600", "tcp://*:5601"]


async def test_servers_connect_their_publishers_to_a_bound_subscriber() -> None:
    """vLLM's rule: an endpoint without ``*`` is connected to. Two servers publish into one
    SUB socket bound by the receiver (llm-d's centralized mode), each under its own topic."""
    sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(b"kv@")
    sub.bind("tcp://127.0.0.1:*")
    kv = KVEventsConfig(enable_kv_cache_events=True,
                        endpoint=sub.getsockopt_string(zmq.LAST_ENDPOINT),
                        topic="kv@{host}:{port}@{model}")
    try:
        async with start_fleet([tiny(kv_events=kv, time_scale=0.05),
                                tiny(kv_events=kv, time_scale=0.05)]) as fleet, \
                httpx.AsyncClient(timeout=10) as c:
            want = {f"kv@127.0.0.1:{port}@{MODEL}".encode() for port in fleet.ports}
            seen: dict[bytes, list[int]] = {}
            for n in range(200):  # ZMQ's slow joiner: publish until both topics arrive
                for url in fleet.urls:
                    r = await c.post(url + "/v1/completions", json={
                        "model": MODEL, "prompt": f"connect {n} " * 10, "max_tokens": 1})
                    assert r.status_code == 200
                while await sub.poll(20):
                    topic, seq, payload = parse_message(await sub.recv_multipart())
                    assert any(isinstance(e, BlockStored) for e in decode_batch(payload).events)
                    seen.setdefault(topic, []).append(seq)
                if set(seen) == want:
                    break
            assert set(seen) == want
            for seqs in seen.values():  # each publisher numbers its own batches
                assert seqs == sorted(seqs)
    finally:
        sub.close()


def test_bad_kv_events_config_flag_exits_2_with_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "sim.main", "--kv-events-config",
                        '{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}'],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "endpont" in r.stderr


async def test_reset_prefix_cache_is_refused_while_requests_hold_blocks() -> None:
    async with start_fleet([tiny(kv_events=KV, time_scale=1.0)]) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as c:
        task = asyncio.create_task(c.post("/v1/completions", json={
            "model": MODEL, "prompt": "h" * 100, "max_tokens": 200}))
        engine = fleet.servers[0].engine
        for _ in range(500):
            if engine.num_running:
                break
            await asyncio.sleep(0.01)
        r = await c.post("/reset_prefix_cache")
        assert r.status_code == 409 and r.json()["reset"] is False
        task.cancel()


async def test_tokenize_returns_the_ids_kv_events_carry(fleet: Fleet) -> None:
    prompt = "tokenize me, please " * 3
    async with httpx.AsyncClient(base_url=fleet.urls[0]) as c:
        r = await c.post("/tokenize", json={"model": MODEL, "prompt": prompt})
        assert r.status_code == 200
        body = r.json()
        assert body["tokens"] == token_ids(prompt.encode()) and body["count"] == 15
        assert body["max_model_len"] == fleet.servers[0].cfg.profile.max_model_len
        chat = await c.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
        assert chat.json()["tokens"][:4] == token_ids(b"<|begin_of_text|>")[:4]
        # Token ids in, the same ids out: the token-producer round trip.
        again = await c.post("/tokenize", json={"prompt": body["tokens"]})
        assert again.json()["tokens"] == body["tokens"]
        for bad, status in [({}, 400), ({"prompt": 5}, 400), ({"messages": []}, 400),
                            ({"model": "nope", "prompt": "x"}, 404)]:
            r = await c.post("/tokenize", json=bad)
            assert r.status_code == status and "error" in r.json()
