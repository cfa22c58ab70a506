"""The simulator's KV events have real vLLM's wire layout (issue #19's fidelity check).

``make test-vllm`` records what a real vLLM 0.32 publishes into
``tests/vllm/fixtures/vllm_kv_events_layout.json`` (frames, payload shape, per event type
the keys and msgpack types, and constants such as ``medium`` and ``kv_cache_spec_kind``) and
fails if a real server stops matching it. This test records the simulator's events with the
same :class:`tests.vllm.kv_capture.Layout` under the same traffic shape (a prompt, one that
extends it, one that evicts both) and compares them with the same committed fixture, so the
two sides are held to one recorded truth: it fails if either drifts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import zmq.asyncio

from sim.fleet import Fleet, start_fleet
from sim.kvevents import KVEventsConfig
from tests.sim.test_kv_events_publish import complete, subscribe
from tests.support.sim import tiny
from tests.vllm.kv_capture import Layout, comparable

FIXTURE = (Path(__file__).resolve().parents[1] / "vllm" / "fixtures"
           / "vllm_kv_events_layout.json")
#: The fixture's server: blocks of 32 tokens, topic ``kv-events`` (tests/vllm/harness.py).
KV = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:*",
                    topic="kv-events")


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    # 8 blocks of 32 tokens; the simulator's tokenizer makes 4 bytes one token.
    async with start_fleet([tiny(kv_events=KV, block_size=32, num_gpu_blocks=8,
                                 time_scale=0.05)]) as f:
        yield f


async def record(sub: zmq.asyncio.Socket, layout: Layout) -> None:
    """Add every message until both event kinds were seen and nothing came for 0.5 s."""
    while True:
        if await sub.poll(500):
            layout.add(await sub.recv_multipart())
        elif layout.seen("BlockStored", "BlockRemoved"):
            return
        else:
            raise AssertionError(f"no more events; seen so far: {layout.counts}")


async def test_simulator_kv_event_layout_matches_real_vllm_fixture(fleet: Fleet) -> None:
    sub = await subscribe(fleet)  # drains the AllBlocksCleared batches it used to connect
    layout = Layout(unpack=msgspec.msgpack.decode)
    await complete(fleet, "a" * 300)  # 75 tokens: 2 full blocks, no parent
    await complete(fleet, "a" * 300 + "b" * 200)  # 3rd block stored with a parent
    await complete(fleet, "c" * 1000)  # 250 tokens need all 8 blocks: evicts the others
    await record(sub, layout)
    sub.close()
    seen = layout.to_json(version="simulator")
    assert seen["facts"]["hashes_fit_uint64"] == [True]
    recorded = comparable(json.loads(FIXTURE.read_text()))
    assert comparable(seen) == recorded, (
        "the simulator's KV events differ from real vLLM's recorded layout "
        f"({FIXTURE.name}):\n{json.dumps(comparable(seen), indent=1)}")


def test_layout_comparison_catches_a_missing_field() -> None:
    """The comparison is not vacuous: a BlockStored without ``kv_cache_spec_kind`` differs."""
    recorded = json.loads(FIXTURE.read_text())
    layout = Layout(unpack=msgspec.msgpack.decode)
    event = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
             "token_ids": [0] * 32, "block_size": 32, "lora_id": None, "medium": "GPU",
             "lora_name": None, "extra_keys": [None], "group_idx": 0}
    layout.add([b"kv-events", (0).to_bytes(8, "big"),
                msgspec.msgpack.encode([1.0, [event], 0])])
    seen = comparable(layout.to_json(version="x"))
    assert "kv_cache_spec_kind" not in seen["events"]["BlockStored"]
    assert seen["events"]["BlockStored"] != comparable(recorded)["events"]["BlockStored"]
