"""KV-event indexing throughput and score latency of ``epp.kvcache`` on one core.

Run: ``python -m bench.kv_index_bench`` (about 20 s; ``--quick`` for a few seconds).

Builds vLLM-shaped msgpack batches in advance (what a server's PUB socket sends: BlockStored
chains of 16-token blocks, then evictions of older blocks), then times, in this process,
decode + apply for all of them, i.e. the subscriber's work per batch without the socket.
Reports block events indexed per second (stored + removed hashes), the index's size, and
the time to score a 4,096-token prompt (256 blocks) against 8 endpoints.

Then the same through real sockets: a PUB socket (in a thread of this process) sends the
batches to a :class:`~epp.kvcache.KVEventSubscriber`; first as fast as it can (block events
indexed per CPU second of the subscriber's thread), then paced at 20,000 block events/s with
fresh timestamps (publish-to-indexed lag from the subscriber's histogram). With
``--central``, the sockets part runs llm-d's centralized mode instead: the PUB socket
connects to a :class:`~epp.kvcache.KVEventCollector` bound on this side, topic
``kv@<ip>@<model>`` (the endpoint taken from the topic, each endpoint on its own task).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import threading
import time
from array import array

import zmq
from prometheus_client import CollectorRegistry

from epp.kvcache import (
    IndexConfig,
    KVBlockIndex,
    KVEventCollector,
    KVEventMetrics,
    KVEventSource,
    KVEventSubscriptions,
)
from shared.kvevents import BlockRemoved, BlockStored, EventBatch, decode_batch, encode_batch

BS = 16
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def build(n_batches: int, endpoints: int, blocks_per_batch: int, seed: int) -> list[
        tuple[str, bytes]]:
    """Per batch: one new prompt's blocks stored, the previous prompt's blocks removed."""
    rng = random.Random(seed)
    out: list[tuple[str, bytes]] = []
    last: dict[str, list[int | bytes]] = {}
    for i in range(n_batches):
        ep = f"10.0.0.{i % endpoints}:8000"
        toks = [rng.randrange(128_000) for _ in range(blocks_per_batch * BS)]
        hashes: list[int | bytes] = [rng.getrandbits(64) for _ in range(blocks_per_batch)]
        events: list[BlockStored | BlockRemoved] = []
        if ep in last:
            events.append(BlockRemoved(block_hashes=last[ep], medium="GPU"))
        events.append(BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=toks,
                                  block_size=BS, lora_id=None, medium="GPU", lora_name=None))
        last[ep] = hashes
        out.append((ep, encode_batch(EventBatch(ts=time.time(), events=list(events),
                                                data_parallel_rank=0))))
    return out


def run(quick: bool) -> None:
    n = 2_000 if quick else 20_000
    batches = build(n, endpoints=8, blocks_per_batch=8, seed=1)
    index = KVBlockIndex(IndexConfig(block_size=BS))
    blocks = 0
    t0 = time.process_time()
    for ep, payload in batches:
        for ev in decode_batch(payload).events:
            blocks += index.apply(ep, ev, MODEL)
    cpu = time.process_time() - t0
    print(f"indexed {blocks} block events from {n} batches in {cpu:.2f} CPU s: "
          f"{blocks / cpu:,.0f} block events/s on one core; index keys {len(index)}")

    # Score: 8 endpoints each holding a prefix of one 256-block prompt (various lengths).
    rng = random.Random(2)
    prompt = [rng.randrange(128_000) for _ in range(256 * BS)]
    for e in range(8):
        held = 32 * (e + 1)
        held_hashes: list[int | bytes] = [rng.getrandbits(64) for _ in range(held)]
        index.apply(f"p{e}", BlockStored(block_hashes=held_hashes, parent_block_hash=None,
                                         token_ids=prompt[: held * BS], block_size=BS,
                                         lora_id=None, medium="GPU", lora_name=None), MODEL)
    times = []
    reps = 200 if quick else 2_000
    c0 = time.process_time()
    for _ in range(reps):
        t = time.perf_counter()
        scores = index.score(prompt, MODEL)
        times.append(time.perf_counter() - t)
    cpu_each = (time.process_time() - c0) / reps
    assert scores["p7"] == 256
    times.sort()
    p99 = times[int(len(times) * 0.99)]
    print(f"score of a 4,096-token prompt over 8 endpoints: median "
          f"{statistics.median(times) * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us wall "
          f"(p99 is the machine's load), {cpu_each * 1e6:.0f} us CPU each")


def _send(pub: zmq.Socket[bytes], payloads: list[bytes], start: int, rate: float | None,
          restamp: bool, topic: bytes) -> None:
    t0 = time.perf_counter()
    for i, payload in enumerate(payloads):
        if rate is not None:
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        if restamp:  # fresh publish time, so the subscriber's lag histogram means something
            batch = decode_batch(payload)
            batch.ts = time.time()
            payload = encode_batch(batch)
        pub.send_multipart([topic, (start + i).to_bytes(8, "big"), payload])


async def sockets(quick: bool, central: bool = False) -> None:
    n = 2_000 if quick else 20_000
    payloads = [p for _, p in build(n, endpoints=1, blocks_per_batch=8, seed=3)]
    pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    registry = CollectorRegistry()
    metrics = KVEventMetrics(registry)
    index = KVBlockIndex(IndexConfig(block_size=BS))
    ep = "10.0.0.1:8000"
    subs = KVEventSubscriptions(index, metrics)
    collector = KVEventCollector("tcp://127.0.0.1:*", index, metrics, topic_filter="kv@")
    if central:
        collector.bind()
        assert collector.bound is not None
        await collector.sync([KVEventSource(ep, collector.address, MODEL)])
        collector.start()
        pub.connect(collector.bound)
        topic = f"kv@10.0.0.1@{MODEL}".encode()
    else:
        pub.bind("tcp://127.0.0.1:*")
        await subs.sync([KVEventSource(ep, pub.getsockopt_string(zmq.LAST_ENDPOINT), MODEL)])
        topic = b"kv"

    def applied() -> int:
        if central:
            stream = collector.streams.get(ep)
            return stream.batches if stream is not None else 0
        return subs.subscribers[ep].batches

    seq = 0
    while applied() == 0:  # slow joiner
        pub.send_multipart([topic, seq.to_bytes(8, "big"), payloads[0]])
        seq += 1
        await asyncio.sleep(0.05)
    def lag_buckets() -> list[tuple[float, float]]:
        fam = next(m for m in registry.collect() if m.name.endswith("lag_seconds"))
        return [(float(x.labels["le"]), x.value) for x in fam.samples
                if x.name.endswith("_bucket")]

    lag_before: list[tuple[float, float]] = []
    for label, rate, restamp in (("as fast as possible", None, False),
                                 ("paced at 20,000 block events/s", 20_000 / 16, True)):
        lag_before = lag_buckets()
        before = applied()
        c0, w0 = time.thread_time(), time.perf_counter()
        t = threading.Thread(target=_send, args=(pub, payloads, seq, rate, restamp, topic))
        t.start()
        while applied() - before < n:
            await asyncio.sleep(0.01)
        t.join()
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        seq += n
        blocks = 16 * n
        mode = " (centralized)" if central else ""
        print(f"sockets{mode}, {label}: {n} batches (~{blocks} block events) indexed in "
              f"{wall:.2f} s; subscriber's thread {cpu:.2f} CPU s")
    # Lag of the paced run only: bucket counts after minus before it.
    paced = [(le, v - v0) for (le, v), (_, v0) in zip(lag_buckets(), lag_before, strict=True)]
    total = paced[-1][1]
    p50 = next(le for le, v in paced if v >= 0.5 * total)
    p99 = next(le for le, v in paced if v >= 0.99 * total)
    print(f"paced run, publish-to-indexed lag: p50 <= {p50 * 1000:g} ms, "
          f"p99 <= {p99 * 1000:g} ms (histogram bucket bounds)")
    await subs.stop()
    await collector.stop()
    pub.close(linger=0)


def memory(quick: bool) -> None:
    """Index memory against its bound: 4 endpoints each storing 3 x ``max_keys`` distinct
    blocks and never evicting (the worst case: nothing is ever removed), measured with
    ``tracemalloc`` (the index's own allocations, events freed after each apply)."""
    import gc
    import os
    import tracemalloc

    for max_keys in ((2_000, 8_000) if quick else (10_000, 40_000)):
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        index = KVBlockIndex(IndexConfig(block_size=BS, max_keys=max_keys))
        per_event = 8
        stored = 0
        for ep in range(4):
            for _ in range(3 * max_keys // per_event):
                toks = array("I", os.urandom(per_event * BS * 4)).tolist()
                hashes: list[int | bytes] = [random.getrandbits(64) for _ in range(per_event)]
                stored += index.apply(f"10.0.0.{ep}:8000", BlockStored(
                    block_hashes=hashes, parent_block_hash=None, token_ids=toks,
                    block_size=BS, lora_id=None, medium="GPU", lora_name=None), MODEL)
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        engine = max(index.endpoint_blocks().values())
        print(f"memory: max_keys {max_keys:,}: {stored:,} blocks stored over 4 endpoints -> "
              f"{len(index):,} keys (<= max_keys), <= {engine:,} engine hashes per endpoint; "
              f"{used / 2**20:.1f} MiB ({used / max_keys:.0f} B per max_key)")
        del index


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--memory-only", action="store_true", help="only the memory bound")
    p.add_argument("--central", action="store_true",
                   help="sockets part in llm-d's centralized mode (a bound collector)")
    ns = p.parse_args()
    memory(ns.quick)
    if ns.memory_only:
        return
    run(ns.quick)
    asyncio.run(sockets(ns.quick, ns.central))


if __name__ == "__main__":
    main()
