"""llm-d's centralized KV-event mode over real sockets: the EPP side binds one SUB socket
(:class:`KVEventCollector`) and simulated vLLM servers on distinct loopback IPs connect their
publishers to it; the endpoint of each batch is named by its topic."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from epp.kvcache import IndexConfig, KVBlockIndex, KVEventMetrics
from epp.kvcache.subscriber import (
    KVEventCollector,
    KVEventSource,
    KVEventSubscriptions,
    SubscriberConfig,
)
from modelserver.kvevents import BlockStored, EventBatch, encode_batch, seq_to_bytes
from sim.config import ServerConfig
from sim.fleet import start_fleet
from sim.kvevents import KVEventsConfig
from tests.epp.kvcache.test_epp_kv_events_from_sim import FAST, MODEL, Rig, until
from tests.support.sim import tiny


def server(host: str, collector: str, topic: str = "kv@{host}@{model}",
           **changes: object) -> ServerConfig:
    """A simulated server on ``host`` whose publisher connects to ``collector``."""
    return tiny(host=host, time_scale=0.05, **changes, kv_events=KVEventsConfig(
        enable_kv_cache_events=True, endpoint=collector, topic=topic,
        replay_endpoint=f"tcp://{host}:*"))


@dataclass
class CentralRig(Rig):
    """The from-sim rig's helpers, the servers publishing into ``collector`` (no ``subs``)."""

    collector: KVEventCollector | None = None
    cold: list[str] = field(default_factory=list)

    @property
    def central(self) -> KVEventCollector:
        assert self.collector is not None
        return self.collector

    def source(self, i: int) -> KVEventSource:
        pub = self.fleet.servers[i].kv_publisher
        assert pub is not None
        return KVEventSource(endpoint=self.ep(i), address=self.central.address,
                             replay_address=pub.replay_endpoint, model=MODEL,
                             topic_filter="kv@")

    async def pool(self, *members: int) -> None:
        await self.central.sync([self.source(i) for i in members])

    def kv(self, name: str, **labels: str) -> float:
        return self.metric(f"inference_extension_kv_events_{name}", **labels)

    async def heard(self, i: int) -> None:
        """Fillers on server ``i`` until its batches reach the collector (a connecting
        publisher drops what it sends before the connection is up)."""
        for n in range(200):
            await self.complete(i, f"filler {n} " * 8)
            if self.central.live(self.ep(i)):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"server {i} never reached the collector")


async def rig(hosts: list[str], members: list[int], *, topics: dict[int, str] | None = None,
              blocks: int = 8) -> AsyncIterator[CentralRig]:
    registry = CollectorRegistry()
    index = KVBlockIndex(IndexConfig(block_size=16))
    cold: list[str] = []
    metrics = KVEventMetrics(registry)
    collector = KVEventCollector("tcp://127.0.0.1:*", index, metrics, FAST,
                                 on_cold=cold.append, topic_filter="kv@")
    collector.bind()
    assert collector.bound is not None
    cfgs = [server(h, collector.bound, **({"topic": topics[i]} if topics and i in topics
                                           else {}), num_gpu_blocks=blocks)
            for i, h in enumerate(hosts)]
    async with start_fleet(cfgs) as fleet, httpx.AsyncClient(timeout=10) as client:
        r = CentralRig(fleet, index, KVEventSubscriptions(index, metrics), registry, client,
                       collector=collector, cold=cold)
        await r.pool(*members)
        collector.start()
        try:
            await asyncio.gather(*(r.heard(i) for i in members))
            yield r
        finally:
            await collector.stop()


@pytest.fixture
async def three() -> AsyncIterator[CentralRig]:
    """Servers on 127.0.0.2 and .3 in the pool (.3's topic names ``ip:port``, .2's the bare
    IP, llm-d's ``kv@${POD_IP}@model``); 127.0.0.4 publishes too but is not in the pool."""
    async for r in rig(["127.0.0.2", "127.0.0.3", "127.0.0.4"], [0, 1],
                       topics={1: "kv@{host}:{port}@{model}"}):
        yield r


async def test_events_reach_the_index_under_the_endpoint_their_topic_names(
        three: CentralRig) -> None:
    r = three
    a, b = "system prompt A. " * 8, "another system B " * 8  # 2 full blocks each
    await r.learn(0, a)
    await r.learn(1, b)
    assert r.score(a + "question") == {r.ep(0): 2}
    assert r.score(b) == {r.ep(1): 2}
    assert r.in_step(0) and r.in_step(1)
    assert r.kv("batches_total", endpoint=r.ep(0)) > 0
    assert r.kv("batches_total", endpoint=r.ep(1)) > 0


async def test_evictions_and_clears_reach_the_index(three: CentralRig) -> None:
    r = three
    first = "a" * 260
    await r.learn(0, first)
    await r.complete(0, "b" * 480)  # needs all 8 blocks: the first prompt is evicted
    await until(lambda: r.score(first) == {} and r.in_step(0), "eviction indexed")
    assert r.kv("blocks_total", type="BlockRemoved") >= 4
    p = "shared prefix .. " * 8
    await r.learn(0, p)
    await r.learn(1, p)
    assert (await r.client.post(r.fleet.urls[1] + "/reset_prefix_cache")).json() == \
        {"reset": True}
    await until(lambda: r.score(p) == {r.ep(0): 2}, "clear indexed")
    assert r.kv("events_total", type="AllBlocksCleared") == 1
    assert r.in_step(0) and r.in_step(1)


async def test_a_restarted_server_is_forgotten_then_relearnt(three: CentralRig) -> None:
    r = three
    before, after = "before restart. " * 8, "after restart.. " * 8
    await r.learn(0, before)
    await r.learn(1, before)
    for n in range(6):  # more batches than the revived server sends before it is heard
        await r.complete(0, f"history {n} " * 8)
    port = r.fleet.ports[0]
    await r.fleet.kill(port)
    await r.fleet.revive(port)
    # Nothing tells a bound socket that a publisher went away: only the sequence going
    # back to 0 (a new publisher) does.
    await _publish_until_restart(r, 0)
    await r.learn(0, after)
    assert r.score(before) == {r.ep(1): 2}  # the revived server's cache is cold
    assert r.in_step(0) and r.in_step(1)
    assert r.ep(0) in r.cold  # the scorer's other guesses are told to forget too
    assert r.kv("sequence_gaps_total", outcome="resynced") == 0


async def _publish_until_restart(r: CentralRig, i: int) -> None:
    for n in range(200):
        if r.kv("publisher_restarts_total", endpoint=r.ep(i)) == 1:
            return
        await r.complete(i, f"revived {n} " * 8)
        await asyncio.sleep(0.02)
    raise AssertionError("the restart was never seen")


async def test_a_topic_naming_no_pool_endpoint_is_skipped_and_counted(three: CentralRig) -> None:
    r = three
    outsider = "published by a server outside the pool " * 4
    for n in range(200):  # until its batches provably reach the collector
        await r.complete(2, f"{outsider} {n}")
        if r.kv("unmatched_batches_total", reason="no_endpoint") > 0:
            break
        await asyncio.sleep(0.02)
    assert r.kv("unmatched_batches_total", reason="no_endpoint") > 0
    assert r.ep(2) not in r.index.endpoint_blocks()
    # It joins the pool: its tracking starts fresh (its history from the replay socket).
    await r.pool(0, 1, 2)
    await r.learn(2, "after joining the pool " * 4)
    assert r.in_step(2)
    assert r.kv("publisher_restarts_total", endpoint=r.ep(2)) == 0


async def test_a_bare_ip_shared_by_several_endpoints_is_ambiguous() -> None:
    """Two servers (ports) on one IP, both publishing ``kv@<ip>@model``: which one a batch
    describes cannot be known, so none is credited."""
    async for r in rig(["127.0.0.5", "127.0.0.5", "127.0.0.6"], [2]):
        await r.pool(0, 1, 2)
        for n in range(200):
            await r.complete(0, f"which one {n} " * 8)
            if r.kv("unmatched_batches_total", reason="ambiguous_endpoint") > 0:
                break
            await asyncio.sleep(0.02)
        assert r.kv("unmatched_batches_total", reason="ambiguous_endpoint") > 0
        assert r.index.endpoint_blocks().keys() <= {r.ep(2)}


async def test_hostile_frames_into_the_bound_socket_are_counted_and_skipped(
        three: CentralRig) -> None:
    r = three
    assert r.central.bound is not None
    evil = zmq.asyncio.Context.instance().socket(zmq.PUB)
    evil.setsockopt(zmq.LINGER, 0)
    evil.connect(r.central.bound)
    topic = f"kv@{r.ep(1)}@{MODEL}".encode()  # it even claims a real endpoint's topic

    sample = r.kv

    try:
        for _ in range(200):  # until a probe provably arrives (slow joiner)
            await evil.send_multipart([b"kv@probe", b"short", b"x"])
            await asyncio.sleep(0.02)
            if sample("malformed_total", reason="bad_frames") > 0:
                break
        base = sample("malformed_total", reason="bad_frames")
        assert base > 0
        await evil.send_multipart([b"kv@only", b"two"])
        await evil.send_multipart([b"kv@x@m"])
        await evil.send_multipart([topic, seq_to_bytes(10**6), b"\xc1 not msgpack"])
        await evil.send_multipart([topic, seq_to_bytes(10**6 + 1), b"\x00" * (17 << 20)])
        await until(lambda: sample("malformed_total", reason="bad_payload") >= 1
                    and sample("malformed_total", reason="bad_frames") >= base + 2,
                    "hostile frames counted")
        # The bound socket still serves the honest publishers.
        await r.learn(0, "still served after the garbage " * 4)
        await r.learn(1, "the claimed endpoint is relearnt " * 4)
        assert r.central._task is not None and not r.central._task.done()
    finally:
        evil.close(linger=0)


async def test_a_hostile_batch_claiming_an_endpoint_is_applied_as_that_endpoint() -> None:
    """The trust model (llm-d's): whoever can connect may speak for any endpoint. What it
    can do is bounded by the index limits, and it is documented."""
    registry = CollectorRegistry()
    index = KVBlockIndex(IndexConfig(block_size=2, max_keys=4))
    collector = KVEventCollector("tcp://127.0.0.1:*", index, KVEventMetrics(registry), FAST,
                                 topic_filter="kv@")
    collector.bind()
    assert collector.bound is not None
    await collector.sync([KVEventSource(endpoint="10.1.1.1:8000", address="", model="m")])
    collector.start()
    pub = zmq.asyncio.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(collector.bound)
    try:
        for seq in range(400):
            ev = BlockStored(block_hashes=[seq], parent_block_hash=None,
                             token_ids=[seq, 0], block_size=2, lora_id=None, medium="GPU",
                             lora_name=None)
            await pub.send_multipart([b"kv@10.1.1.1@m", seq_to_bytes(seq),
                                      encode_batch(EventBatch(ts=0.0, events=[ev]))])
            await asyncio.sleep(0.005)
            if len(index) == 4 and collector.streams["10.1.1.1:8000"].batches > 10:
                break
        assert len(index) == 4  # max_keys holds, however much is claimed
        assert index.endpoint_blocks() == {"10.1.1.1:8000": 4}
    finally:
        pub.close(linger=0)
        await collector.stop()


async def test_a_replay_one_endpoint_waits_for_does_not_hold_up_the_others() -> None:
    """Each endpoint's batches are applied on their own task: endpoint A waiting on a replay
    socket that never answers (a gap, honest or claimed by a hostile peer) leaves B's
    batches flowing."""
    ctx = zmq.asyncio.Context.instance()
    silent = ctx.socket(zmq.ROUTER)  # A's replay socket: takes the request, never answers
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind("tcp://127.0.0.1:*")
    index = KVBlockIndex(IndexConfig(block_size=2))
    registry = CollectorRegistry()
    collector = KVEventCollector(
        "tcp://127.0.0.1:*", index, KVEventMetrics(registry),
        SubscriberConfig(replay_timeout=60.0), topic_filter="kv@")
    collector.bind()
    assert collector.bound is not None
    a, b = "10.2.2.1:8000", "10.2.2.2:8000"
    await collector.sync([
        KVEventSource(endpoint=a, address="", model="m",
                      replay_address=silent.getsockopt_string(zmq.LAST_ENDPOINT)),
        KVEventSource(endpoint=b, address="", model="m")])
    collector.start()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(collector.bound)

    def batch(first: int) -> bytes:
        ev = BlockStored(block_hashes=[first], parent_block_hash=None, token_ids=[first, 0],
                         block_size=2, lora_id=None, medium="GPU", lora_name=None)
        return encode_batch(EventBatch(ts=0.0, events=[ev]))

    async def deliver(topic: bytes, first: int) -> int:
        """Batches 0, 1, ... on ``topic`` until one is indexed; the next sequence number."""
        for seq in range(500):
            await pub.send_multipart([topic, seq_to_bytes(seq), batch(first)])
            await asyncio.sleep(0.02)
            if index.score([first, 0], "m"):
                return seq + 1
        raise AssertionError(f"{topic!r} never indexed")

    def unmatched() -> float:
        return registry.get_sample_value("inference_extension_kv_events_unmatched_batches_total",
                                         {"reason": "no_endpoint"}) or 0.0

    try:
        for _ in range(500):  # probes until the connection is up (slow joiner), so that A's
            await pub.send_multipart([b"kv@10.9.9.9@m", seq_to_bytes(0), batch(9)])
            await asyncio.sleep(0.02)  # first batch is seq 0 and needs no history replayed
            if unmatched():
                break
        after = await deliver(b"kv@10.2.2.1@m", 1)
        assert after == 1
        await pub.send_multipart([b"kv@10.2.2.1@m", seq_to_bytes(after + 50), batch(2)])
        await until(lambda: silent.poll(0) != 0, "A's replay requested")
        await deliver(b"kv@10.2.2.2@m", 3)  # B flows while A waits
        assert collector.streams[a].expected == after  # A is still waiting on its replay
        assert index.score([3, 0], "m") == {b: 1}
    finally:
        pub.close(linger=0)
        await collector.stop()
        silent.close(linger=0)
