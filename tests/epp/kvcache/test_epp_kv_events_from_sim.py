"""The EPP's KV-event subscribers against simulated vLLM servers over real ZMQ sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest
import zmq
import zmq.asyncio
from prometheus_client import REGISTRY, CollectorRegistry

from epp.kvcache import (
    IndexConfig,
    KVBlockIndex,
    KVEventMetrics,
    KVEventSource,
    KVEventSubscriptions,
    SubscriberConfig,
)
from modelserver.kvevents import BlockStored, EventBatch, encode_batch, seq_to_bytes
from sim.fleet import Fleet, start_fleet
from sim.kvevents import KVEventsConfig
from sim.tokenizer import token_ids
from tests.support.sim import tiny

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FAST = SubscriberConfig(reconnect_min=0.05, reconnect_max=0.2, replay_timeout=2.0,
                        heartbeat=0.2)


def kv(replay: bool = True) -> KVEventsConfig:
    return KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:*",
                          replay_endpoint="tcp://127.0.0.1:*" if replay else None,
                          topic="kv@{name}@{model}")


async def until(cond: Callable[[], bool], what: str, *, timeout: float = 10.0) -> None:
    """Wait for ``cond`` (bounded: fails after ``timeout`` s, never asserts on timing)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@dataclass
class Rig:
    fleet: Fleet
    index: KVBlockIndex
    subs: KVEventSubscriptions
    registry: CollectorRegistry
    client: httpx.AsyncClient
    _fill: int = 0

    def ep(self, i: int) -> str:
        server = self.fleet.servers[i]
        return f"{server.cfg.host}:{server.port}"

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    async def complete(self, i: int, prompt: str) -> None:
        r = await self.client.post(self.fleet.urls[i] + "/v1/completions",
                                   json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
        assert r.status_code == 200, r.text

    def score(self, prompt: str) -> dict[str, int]:
        return self.index.score(token_ids(prompt.encode()), MODEL)

    def in_step(self, i: int) -> bool:
        """The index knows exactly as many blocks of server ``i`` as its cache holds."""
        held = self.fleet.servers[i].engine.kv.num_cached
        return self.index.endpoint_blocks().get(self.ep(i), 0) == held

    async def sync_up(self, i: int) -> None:
        """Publish filler batches on server ``i`` until its subscriber receives one.

        A ZMQ subscriber misses what is published before its subscription reaches the
        publisher (the "slow joiner"); after this, nothing more is lost to that.
        """
        sub = self.subs.subscribers[self.ep(i)]
        seen = sub.batches
        for n in range(200):
            await self.complete(i, f"filler {self._fill} {n} " * 8)
            try:
                await until(lambda: sub.batches > seen, "a batch", timeout=0.1)
                return
            except AssertionError:
                continue
            finally:
                self._fill += 1
        raise AssertionError("the subscriber never received a batch")

    async def learn(self, i: int, prompt: str) -> None:
        """Send ``prompt`` to server ``i`` and wait until the index has all its blocks."""
        blocks = len(token_ids(prompt.encode())) // 16
        await self.complete(i, prompt)
        await until(lambda: self.score(prompt).get(self.ep(i)) == blocks, "prompt indexed")


def sources(fleet: Fleet) -> list[KVEventSource]:
    out = []
    for s in fleet.servers:
        pub = s.kv_publisher
        assert pub is not None
        out.append(KVEventSource(endpoint=f"127.0.0.1:{s.port}", address=pub.endpoint,
                                 replay_address=pub.replay_endpoint, model=MODEL,
                                 topic_filter="kv@"))
    return out


async def rig(*cfgs: object) -> AsyncIterator[Rig]:
    async with start_fleet(list(cfgs)) as fleet, httpx.AsyncClient(timeout=10) as client:  # type: ignore[arg-type]
        registry = CollectorRegistry()
        metrics = KVEventMetrics(registry)
        index = KVBlockIndex(IndexConfig(block_size=16))
        subs = KVEventSubscriptions(index, metrics, FAST)
        await subs.sync(sources(fleet))
        r = Rig(fleet, index, subs, registry, client)
        try:
            for i in range(len(fleet.servers)):
                await r.sync_up(i)
            yield r
        finally:
            await subs.stop()


@pytest.fixture
async def two() -> AsyncIterator[Rig]:
    async for r in rig(tiny(kv_events=kv(), num_gpu_blocks=8, time_scale=0.05),
                       tiny(kv_events=kv(), num_gpu_blocks=8, time_scale=0.05)):
        yield r


async def test_stored_blocks_reach_the_index_and_score_the_right_server(two: Rig) -> None:
    a, b = "system prompt A. " * 8, "another system B " * 8  # 136 bytes: 2 full blocks
    await two.learn(0, a)
    await two.learn(1, b)
    assert two.score(a + "question") == {two.ep(0): 2}
    assert two.score(b) == {two.ep(1): 2}
    assert two.in_step(0) and two.in_step(1)
    assert two.metric("inference_extension_kv_events_events_total", type="BlockStored") >= 2
    held = [s.engine.kv.num_cached for s in two.fleet.servers]  # prompts + distinct fillers
    assert len(two.index) == sum(held)
    assert two.index.endpoint_blocks()[two.ep(0)] == held[0]


async def test_an_endpoint_leaving_the_pool_is_unsubscribed_and_forgotten(two: Rig) -> None:
    p = "leaving the pool " * 8
    await two.learn(0, p)
    await two.subs.sync(sources(two.fleet)[1:])
    assert list(two.subs.subscribers) == [two.ep(1)]
    assert two.score(p) == {}


async def test_evictions_reach_the_index_as_removals(two: Rig) -> None:
    first = "a" * 260
    await two.learn(0, first)
    await two.complete(0, "b" * 480)  # needs all 8 blocks: the first prompt is evicted
    await until(lambda: two.score(first) == {} and two.in_step(0), "eviction indexed")
    assert two.score("b" * 480) == {two.ep(0): 7}
    evicted = two.fleet.servers[0].engine.kv.evictions
    assert evicted >= 4
    assert two.metric("inference_extension_kv_events_blocks_total",
                      type="BlockRemoved") == evicted


async def test_cleared_cache_reaches_the_index(two: Rig) -> None:
    p = "shared prefix .. " * 8
    await two.learn(0, p)
    await two.learn(1, p)
    r = await two.client.post(two.fleet.urls[0] + "/reset_prefix_cache")
    assert r.json() == {"reset": True}
    await until(lambda: two.score(p) == {two.ep(1): 2}, "clear indexed")
    assert two.metric("inference_extension_kv_events_events_total",
                      type="AllBlocksCleared") == 1


@pytest.fixture
async def big() -> AsyncIterator[Rig]:
    async for r in rig(tiny(kv_events=kv(), time_scale=0.05),
                       tiny(kv_events=kv(), time_scale=0.05)):
        yield r


async def test_missed_batches_are_replayed_in_order(big: Rig) -> None:
    two = big
    p1, p2, p3 = "first prompt... " * 20, "second prompt.. " * 20, "third prompt... " * 20
    await two.learn(0, p1)
    sub = two.subs.subscribers[two.ep(0)]
    await sub.stop()  # the EPP's side of the stream breaks
    await two.complete(0, p2)  # published while nobody listens
    sub.start()
    await two.sync_up(0)
    await two.learn(0, p3)
    await until(lambda: two.in_step(0), "index in step")
    assert two.score(p2) == {two.ep(0): 5}  # only the replay can have told us
    assert two.metric("inference_extension_kv_events_sequence_gaps_total",
                      outcome="replayed") == 1
    assert two.metric("inference_extension_kv_events_sequence_gaps_total",
                      outcome="resynced") == 0


async def test_missed_batches_without_replay_resync_the_endpoint() -> None:
    async for r in rig(tiny(kv_events=kv(replay=False), time_scale=0.05)):
        p1, p2, p3 = "first prompt... " * 20, "second prompt.. " * 20, "third prompt... " * 20
        await r.learn(0, p1)
        sub = r.subs.subscribers[r.ep(0)]
        await sub.stop()
        await r.complete(0, p2)
        sub.start()
        await r.sync_up(0)
        await r.learn(0, p3)
        assert r.metric("inference_extension_kv_events_sequence_gaps_total",
                        outcome="resynced") == 1
        # What was learnt before the gap is forgotten: never trusted stale, only what is seen.
        assert r.score(p1) == {} and r.score(p2) == {}
        assert r.score(p3) == {r.ep(0): 5}


async def test_a_restarted_server_is_forgotten_then_relearnt(big: Rig) -> None:
    two = big
    before, after = "before restart. " * 20, "after restart.. " * 20  # 5 blocks each
    await two.learn(0, before)
    await two.learn(1, before)
    sub = two.subs.subscribers[two.ep(0)]
    await two.fleet.kill(two.fleet.ports[0])
    await until(lambda: two.score(before) == {two.ep(1): 5}, "dead server forgotten")
    assert not sub.connected
    await two.fleet.revive(two.fleet.ports[0])
    await two.sync_up(0)  # the subscriber reconnected by itself
    await two.learn(0, after)
    assert sub.connected
    assert two.score(before) == {two.ep(1): 5}  # the revived server's cache is cold
    assert two.in_step(0)
    assert two.metric("inference_extension_kv_events_disconnects_total",
                      endpoint=two.ep(0)) == 1


async def test_malformed_messages_are_counted_and_skipped() -> None:
    """A hostile publisher (a raw ZMQ PUB socket) cannot stop the subscriber."""
    ctx = zmq.asyncio.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    registry = CollectorRegistry()
    metrics = KVEventMetrics(registry)
    index = KVBlockIndex(IndexConfig(block_size=2))
    cfg = SubscriberConfig(reconnect_min=0.05, reconnect_max=0.2, heartbeat=0.2,
                           max_payload_bytes=1024)
    subs = KVEventSubscriptions(index, metrics, cfg)
    address = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    await subs.sync([KVEventSource(endpoint="evil:1", address=address, model="m")])
    sub = subs.subscribers["evil:1"]

    def stored(first: int) -> bytes:
        ev = BlockStored(block_hashes=[first], parent_block_hash=None, token_ids=[first, 0],
                         block_size=2, lora_id=None, medium="GPU", lora_name=None)
        return encode_batch(EventBatch(ts=0.0, events=[ev]))

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(f"inference_extension_kv_events_{name}", labels) or 0.0

    async def deliver(first: int, seq: int) -> int:
        """Send valid batches until one is indexed (slow joiner); returns the next seq."""
        for _ in range(500):
            if index.score([first, 0], "m") == {"evil:1": 1}:
                return seq
            await pub.send_multipart([b"kv", seq_to_bytes(seq), stored(first)])
            seq += 1
            await asyncio.sleep(0.02)
        raise AssertionError(f"batch {first} never indexed")

    try:
        seq = await deliver(1, 0)
        hostile = [
            [b"only", b"two"],
            [b"kv", b"short", b"x"],
            [b"kv", seq_to_bytes(seq), b"not msgpack at all"],
            [b"kv", seq_to_bytes(seq + 1), stored(2)[:-3]],  # truncated
            [b"kv", seq_to_bytes(seq + 2), b"\x93\xcb" + b"\0" * 8 + b"\xdd\xff\xff\xff\xff"],
            [b"kv", seq_to_bytes(seq + 3), b"\x00" * 2048],  # over max_payload_bytes
        ]
        for frames in hostile:
            await pub.send_multipart(frames)
        seq = await deliver(3, seq + 4)
        assert sample("malformed_total", reason="bad_frames") == 2
        assert sample("malformed_total", reason="bad_payload") == 3
        assert sample("malformed_total", reason="too_large") == 1
        assert sample("sequence_gaps_total", outcome="resynced") == 0  # bad batches count
        assert index.score([2, 0], "m") == {}
        # A frame far over the limit is refused by libzmq itself (MAXMSGSIZE), which drops
        # the connection: the endpoint becomes unknown, the subscriber reconnects.
        await pub.send_multipart([b"kv", seq_to_bytes(seq), b"\x00" * 200_000])
        await until(lambda: sample("disconnects_total", endpoint="evil:1") == 1, "drop")
        await deliver(4, seq + 1)
        assert index.score([3, 0], "m") == {}  # forgotten with the lost connection
        assert sub._task is not None and not sub._task.done()
    finally:
        await subs.stop()
        pub.close(linger=0)


async def test_subscriber_health_series_follow_the_subscribers(two: Rig) -> None:
    """llm-d-router v0.10's subscriber health: messages per subscriber, the subscribers
    managed, and a leaving endpoint's series removed with it."""
    messages = "llm_d_router_epp_kv_cache_events_messages_received_total"
    assert two.metric(messages, pod_identifier=two.ep(0)) >= 1  # sync_up saw a batch
    assert two.metric(messages, pod_identifier=two.ep(1)) >= 1

    def active() -> float:
        return REGISTRY.get_sample_value(
            "llm_d_router_epp_kv_cache_events_active_subscribers") or 0.0

    before = active()
    assert before >= 2  # these two (a test run may hold other live subscriptions)
    await two.subs.sync(sources(two.fleet)[1:])
    assert active() == before - 1
    assert two.registry.get_sample_value(messages, {"pod_identifier": two.ep(0)}) is None
    assert two.metric(messages, pod_identifier=two.ep(1)) >= 1
