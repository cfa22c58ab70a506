"""Micro-benchmarks with no simulated fleet: one subcommand each (figures in the docs named).

    python -m bench.micro kv-index [--quick] [--memory-only] [--central]
    python -m bench.micro statestore [--ops 20000] [--repeats 7] [--json]
    python -m bench.micro active-active [--seconds 5] [--rounds 5] [--concurrency 32]
                                        [--save FILE]
    python -m bench.micro pick [--requests N] [--clock wall|cpu]
    python -m bench.micro pick --route [--rounds 7]
    python -m bench.micro slo-pick [--requests 3000] [--endpoints 100] [--fits 10]
    python -m bench.micro rewrite [--events 20000] [--rounds 7]
    python -m bench.micro rss [--seconds 60] [--concurrency 32]
    python -m bench.micro rss --queued 10000 [--body-bytes 3200]

``kv-index`` (docs/precise-prefix.md, "Measured here"): ``epp.kvcache`` on one core. The
index's memory against ``max_keys`` (4 endpoints each storing 3 x ``max_keys`` distinct blocks,
nothing removed: the worst case; ``tracemalloc``); decode + apply of vLLM-shaped msgpack
batches without sockets (block events/s); the score of a 4,096-token prompt over 8 endpoints;
then through a real PUB socket (a thread of this process) into a subscriber, as fast as it
can (the subscriber thread's CPU) and paced at 20,000 block events/s (publish-to-indexed lag
from its histogram). ``--central``: the sockets part in llm-d's centralized mode (the PUB
socket connects to a bound ``KVEventCollector``, the endpoint taken from the topic).

``statestore`` (docs/active-active.md, "Measurements"): its own Valkey; median over repeats
[min-max]. Each synchronous call of a pick on ``memory://`` and ``valkey://`` (a pick writes
one in-flight count and 16 prefix blocks); one ``HINCRBY`` / pipelined ``HGETALL`` round trip
(what an op would cost if the pick waited on Valkey: it does not); one background ``sync()``
carrying 0 / 10 / 100 picks (wall, this process's CPU, Valkey's CPU per pick from ``/proc``);
a pull of another replica's 100 endpoints; propagation from A's ``sync()`` to B's index.

``active-active`` (bench/RESULTS.md, "Throughput"): one Envoy (``devkit.topology``), three
listeners, echo pods answering at once, closed loop, rounds interleaved: ``1 replica, no
store``; ``1 replica + Valkey`` (a sharing replica whose peer syncs but gets no traffic);
``2 replicas + Valkey`` (both in one ext_proc cluster). Per round: req/s and CPU ms per
request of the EPPs and of Valkey, ratios paired by round (``bench.stats``). ``--save FILE``:
per round what the replica twin's CPU model reads (``bench.twin.cpu.load_rounds``).

``pick`` (bench/RESULTS.md, "EPP overhead and pick latency"): the scheduler alone
(``schedule``) at 10 / 100 / 1,000 endpoints; ``--route``: one request's CPU through the
director in process (every request-control plugin, no Envoy). ``slo-pick`` (RESULTS.md,
"SLO"): the director's request path at 100 endpoints with upstream's predicted-latency
profile, idle and while it refits.
``rewrite`` (docs/compatibility.md): CPU per SSE event to rename ``model`` back in a stream.
Each prints its own lines; percentiles are ``bench.stats.quantile``'s. (``bbr``, BBR's
overhead against the no-op floor, is now ``python -m bench.epp_cpu --bbr``.)

``rss`` (docs/reliability.md, RESULTS.md "Reliability"): resident memory each request leaves
behind in BBR and the EPP, through the real gateway (Envoy → BBR → EPP → ``vllm-sim``, 4 pods),
with Envoy's default ext_proc stream close (a
half-close then an immediate reset) and with graceful close (``devkit.envoy.GRACEFUL_CLOSE``:
Envoy half-closes and waits for the service's status).

grpc.aio leaks the native memory of a batch that a stream reset fails or cancels
(grpc/grpc#43360); the services end their streams themselves to stay out of that race
(``shared/extproc.py``), and graceful close removes it. The figure is RSS growth over the
measured run divided by its requests, after a warm-up run of a quarter of its length. The
graceful-close run is the baseline; each run starts fresh processes.

``--queued N`` (issue #14's "10,000 queued"): a running ``epp`` process (flow control on, its
one endpoint ``bench.echo_backend --saturated``, whose metrics say the pool is saturated, so
everything waits) gets N ext_proc streams straight from this process (gRPC, as Envoy would
send them; Envoy's default circuit breaker allows 1,024 concurrent streams to one cluster, so
a single default Envoy could not queue this many), all opened at once. Its RSS (``/proc``) is read
before, with all N queued, and after they are cancelled; then a second round of N shows
whether the memory freed by the first is reused.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

BS = 16
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


# -- kv-index ----------------------------------------------------------------------------------
def _stored(hashes: list[int | bytes], toks: list[int]) -> Any:
    from modelserver.kvevents import BlockStored

    return BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=toks,
                       block_size=BS, lora_id=None, medium="GPU", lora_name=None)


def kv_batches(n: int, endpoints: int, seed: int) -> list[tuple[str, bytes]]:
    """Per batch (8 blocks): one new prompt's blocks stored, the endpoint's previous prompt's
    blocks removed; encoded as a server's PUB socket sends them."""
    from modelserver.kvevents import BlockRemoved, EventBatch, encode_batch

    rng, out = random.Random(seed), []
    last: dict[str, list[int | bytes]] = {}
    for i in range(n):
        ep = f"10.0.0.{i % endpoints}:8000"
        toks = [rng.randrange(128_000) for _ in range(8 * BS)]
        hashes: list[int | bytes] = [rng.getrandbits(64) for _ in range(8)]
        events: list[Any] = [BlockRemoved(block_hashes=last[ep], medium="GPU")] \
            if ep in last else []
        events.append(_stored(hashes, toks))
        last[ep] = hashes
        out.append((ep, encode_batch(EventBatch(ts=time.time(), events=events,
                                                data_parallel_rank=0))))
    return out


def kv_memory(quick: bool) -> None:
    from epp.kvcache import IndexConfig, KVBlockIndex

    for max_keys in ((2_000, 8_000) if quick else (10_000, 40_000)):
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        index = KVBlockIndex(IndexConfig(block_size=BS, max_keys=max_keys))
        stored = sum(index.apply(f"10.0.0.{ep}:8000", _stored(
            [random.getrandbits(64) for _ in range(8)],
            array("I", os.urandom(8 * BS * 4)).tolist()), MODEL)
            for ep in range(4) for _ in range(3 * max_keys // 8))
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        engine = max(index.endpoint_blocks().values())
        print(f"memory: max_keys {max_keys:,}: {stored:,} blocks stored over 4 endpoints -> "
              f"{len(index):,} keys (<= max_keys), <= {engine:,} engine hashes per endpoint; "
              f"{used / 2**20:.1f} MiB ({used / max_keys:.0f} B per max_key)")


def kv_index(quick: bool) -> None:
    from epp.kvcache import IndexConfig, KVBlockIndex
    from modelserver.kvevents import decode_batch

    n = 2_000 if quick else 20_000
    index = KVBlockIndex(IndexConfig(block_size=BS))
    batches = kv_batches(n, 8, seed=1)
    t0 = time.process_time()
    blocks = sum(index.apply(ep, ev, MODEL) for ep, payload in batches
                 for ev in decode_batch(payload).events)
    cpu = time.process_time() - t0
    print(f"indexed {blocks} block events from {n} batches in {cpu:.2f} CPU s: "
          f"{blocks / cpu:,.0f} block events/s on one core; index keys {len(index)}")
    # 8 endpoints each holding a prefix (32 x (e + 1) blocks) of one 256-block prompt.
    rng = random.Random(2)
    prompt = [rng.randrange(128_000) for _ in range(256 * BS)]
    for e in range(8):
        held = 32 * (e + 1)
        index.apply(f"p{e}", _stored([rng.getrandbits(64) for _ in range(held)],
                                     prompt[: held * BS]), MODEL)
    reps, times = (200 if quick else 2_000), []
    c0 = time.process_time()
    for _ in range(reps):
        t = time.perf_counter()
        scores = index.score(prompt, MODEL)
        times.append(time.perf_counter() - t)
    assert scores["p7"] == 256
    times.sort()
    print(f"score of a 4,096-token prompt over 8 endpoints: median "
          f"{statistics.median(times) * 1e6:.0f} us, p99 {times[int(len(times) * 0.99)] * 1e6:.0f}"
          f" us wall (p99 is the machine's load), "
          f"{(time.process_time() - c0) / reps * 1e6:.0f} us CPU each")


async def kv_sockets(quick: bool, central: bool) -> None:
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
    from modelserver.kvevents import decode_batch, encode_batch

    n = 2_000 if quick else 20_000
    payloads = [p for _, p in kv_batches(n, 1, seed=3)]
    pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    registry = CollectorRegistry()
    metrics, index, ep = KVEventMetrics(registry), KVBlockIndex(IndexConfig(block_size=BS)), \
        "10.0.0.1:8000"
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

    def send(start: int, rate: float | None, restamp: bool) -> None:
        t0 = time.perf_counter()
        for i, payload in enumerate(payloads):
            if rate is not None and (delay := t0 + i / rate - time.perf_counter()) > 0:
                time.sleep(delay)
            if restamp:  # a fresh publish time, so the lag histogram means something
                batch = decode_batch(payload)
                batch.ts = time.time()
                payload = encode_batch(batch)
            pub.send_multipart([topic, (start + i).to_bytes(8, "big"), payload])

    def lag_buckets() -> list[tuple[float, float]]:
        fam = next(m for m in registry.collect() if m.name.endswith("lag_seconds"))
        return [(float(x.labels["le"]), x.value) for x in fam.samples
                if x.name.endswith("_bucket")]

    seq = 0
    while applied() == 0:  # the slow joiner
        pub.send_multipart([topic, seq.to_bytes(8, "big"), payloads[0]])
        seq += 1
        await asyncio.sleep(0.05)
    lag_before: list[tuple[float, float]] = []
    for label, rate, restamp in (("as fast as possible", None, False),
                                 ("paced at 20,000 block events/s", 20_000 / 16, True)):
        lag_before, before = lag_buckets(), applied()
        c0, w0 = time.thread_time(), time.perf_counter()
        t = threading.Thread(target=send, args=(seq, rate, restamp))
        t.start()
        while applied() - before < n:
            await asyncio.sleep(0.01)
        t.join()
        seq += n
        print(f"sockets{' (centralized)' if central else ''}, {label}: {n} batches "
              f"(~{16 * n} block events) indexed in {time.perf_counter() - w0:.2f} s; "
              f"subscriber's thread {time.thread_time() - c0:.2f} CPU s")
    paced = [(le, v - v0) for (le, v), (_, v0) in zip(lag_buckets(), lag_before, strict=True)]
    p50, p99 = (next(le for le, v in paced if v >= q * paced[-1][1]) for q in (0.5, 0.99))
    print(f"paced run, publish-to-indexed lag: p50 <= {p50 * 1000:g} ms, "
          f"p99 <= {p99 * 1000:g} ms (histogram bucket bounds)")
    await subs.stop()
    await collector.stop()
    pub.close(linger=0)


# -- statestore --------------------------------------------------------------------------------
BLOCKS, ENDPOINTS = 16, 100  # prefix blocks per pick (a ~1,000-token prompt); endpoints


def _summary(samples: list[float], cpu: list[float] | None = None) -> dict[str, float]:
    """Median and range in microseconds (and the median CPU time of this process)."""
    out = {"median_us": statistics.median(samples) * 1e6, "min_us": min(samples) * 1e6,
           "max_us": max(samples) * 1e6}
    if cpu:
        out["cpu_median_us"] = statistics.median(cpu) * 1e6
    return out


def _pick_ops(store: Any) -> dict[str, Callable[[int], object]]:
    """The synchronous calls of one pick, each as ``f(i)`` (chain k lands on endpoint k, as
    prefix-aware routing makes it)."""
    chains = [[(k << 20) + b for b in range(BLOCKS)] for k in range(64)]
    for k, chain in enumerate(chains):
        store.prefix_add(f"10.0.0.{k}:8000", chain, 31_250)
    ep = lambda i: f"10.0.0.{i % ENDPOINTS}:8000"  # noqa: E731
    return {"add_inflight": lambda i: store.add_inflight(ep(i), 1, 500),
            "inflight": lambda i: store.inflight(ep(i)),
            "prefix_add_16": lambda i: store.prefix_add(f"10.0.0.{i % 64}:8000",
                                                        chains[i % 64], 31_250),
            "prefix_match_16": lambda i: store.prefix_match(chains[i % 64]),
            "session_set": lambda i: store.session_set(f"s{i % 1000}", "10.0.0.1:8000"),
            "session_get": lambda i: store.session_get(f"s{i % 1000}")}


def _loop(fn: Callable[[int], object], ops: int) -> None:
    for i in range(ops):
        fn(i)


async def _timed(samples: list[float], cpu: list[float] | None, fn: Callable[[], Any],
                 per: int = 1) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    if asyncio.iscoroutine(result):
        await result
    samples.append((time.perf_counter() - t0) / per)
    if cpu is not None:
        cpu.append(time.process_time() - c0)


async def statestore(ops: int, repeats: int) -> dict[str, Any]:
    import valkey.asyncio as avalkey

    from bench.cpubudget import cpu_seconds
    from devkit.valkey import ValkeyServer
    from epp.statestore import MemoryStateStore, ValkeyStateStore, parse_store_url

    with ValkeyServer() as server:
        url = server.url
        out: dict[str, Any] = {}
        # Request path: the stores alternate within a repeat (order swapped every repeat) so
        # other processes' load falls on both columns alike.
        path: dict[str, dict[str, list[float]]] = {"memory": {}, "valkey": {}}
        for r in range(repeats):
            for kind in (("memory", "valkey") if r % 2 == 0 else ("valkey", "memory")):
                store: Any = MemoryStateStore()
                if kind == "valkey":
                    store = ValkeyStateStore(parse_store_url(url), pool="bench")
                    await store.start()
                for name, fn in _pick_ops(store).items():
                    await _timed(path[kind].setdefault(name, []), None,
                                 functools.partial(_loop, fn, ops), ops)
                    if kind == "valkey":
                        await store.sync()  # keep the queue from growing across op kinds
                await store.close()
        out["request_path"] = {k: {n: _summary(s) for n, s in v.items()} for k, v in path.items()}
        client, n = avalkey.Valkey(port=server.port), max(ops // 20, 50)
        rt: dict[str, list[float]] = {}

        async def incr() -> None:
            for i in range(n):
                await client.execute_command("HINCRBY", "bench:rt", f"r:{i % ENDPOINTS}", 1)

        async def getall() -> None:
            for _ in range(n):
                pipe = client.pipeline(transaction=False)
                pipe.hgetall("bench:rt")
                await pipe.execute()

        for _ in range(repeats):
            for name, op in (("hincrby", incr), ("hgetall_100_fields", getall)):
                await _timed(rt.setdefault(name, []), None, op, n)
        await client.aclose()
        out["round_trip"] = {k: _summary(v) for k, v in rt.items()}
        stores = [ValkeyStateStore(parse_store_url(url + "?sync_interval=3600"),
                                   pool="bench-sync", replica=r) for r in "ab"]
        a, b = stores
        await a.start()  # alone: b's subscriber would share this process's CPU
        bg: dict[str, Any] = {}
        for picks in (0, 10, 100):
            samples: list[float] = []
            cpu: list[float] = []
            valkey0 = cpu_seconds(server.pid or 0)
            for r in range(max(repeats * 10, 4)):
                for i in range(picks):
                    a.add_inflight(f"10.0.0.{i}:8000", 1, 500)
                    a.prefix_add(f"10.0.0.{i}:8000",
                                 [(r << 40) + (i << 20) + k for k in range(BLOCKS)], 31_250)
                await _timed(samples, cpu, a.sync)
            bg[f"sync_{picks}_picks"] = _summary(samples, cpu)
            if picks:
                bg[f"sync_{picks}_picks"]["valkey_cpu_per_pick_us"] = 1e6 * (
                    cpu_seconds(server.pid or 0) - valkey0) / (len(samples) * picks)
        await b.start()
        while not b.shared:
            await asyncio.sleep(0.01)
        delays: list[float] = []
        for r in range(max(repeats * 4, 4)):
            chain = [(1 << 60) + (r << 8) + k for k in range(BLOCKS)]
            a.prefix_add("10.0.0.1:8000", chain, 31_250)

            async def propagate(chain: list[int] = chain) -> None:
                await a.sync()
                while not b.prefix_match(chain[:1]):
                    await asyncio.sleep(0)

            await _timed(delays, None, propagate)
        bg["propagation"] = _summary(delays)
        for i in range(ENDPOINTS):  # the pull: a reads b's in-flight hash on every sync
            b.add_inflight(f"10.0.0.{i}:8000", 1, 500)
        await b.sync()
        samples, cpu = [], []  # the pull
        for _ in range(max(repeats * 10, 4)):
            await _timed(samples, cpu, a.sync)
        bg[f"sync_pull_{ENDPOINTS}_endpoints"] = _summary(samples, cpu)
        for s in stores:
            await s.close()
        return {**out, "background": bg, "ops": ops, "repeats": repeats}


def _fmt(s: dict[str, float]) -> str:
    text = f"{s['median_us']:9.2f} us  [{s['min_us']:.2f}-{s['max_us']:.2f}]"
    if "cpu_median_us" in s:
        text += f"  client cpu {s['cpu_median_us']:.0f} us"
    if "valkey_cpu_per_pick_us" in s:
        text += f"  valkey cpu/pick {s['valkey_cpu_per_pick_us']:.0f} us"
    return text


def statestore_report(res: dict[str, Any]) -> None:
    rp = res["request_path"]
    print(f"request path, per call (median of {res['repeats']} batches of {res['ops']}; "
          f"[min-max])\n{'op':18s} {'memory://':>32s} {'valkey://':>32s}")
    for name in rp["memory"]:
        print(f"{name:18s} {_fmt(rp['memory'][name]):>32s} {_fmt(rp['valkey'][name]):>32s}")
    for title, key in (("\nnetwork round trip to Valkey on loopback, per op", "round_trip"),
                       ("\nbackground (never on the request path)", "background")):
        print(title)
        for name, s in res[key].items():
            print(f"{name:18s} {_fmt(s)}")


# -- active-active -----------------------------------------------------------------------------
ONE, SHARED, PAIR = "1 replica, no store", "1 replica + Valkey", "2 replicas + Valkey"


def active_active(seconds: float, rounds: int, concurrency: int) -> dict[str, Any]:
    """The rounds: per contender a list of ``{rps, errors, requests, wall, epp_cpu: [s per
    watched EPP], valkey_cpu}``, and the load averages seen."""
    from bench.harness import PODS, cpu_load, echo_pool, epp_cmd, interleaved, start_extproc, stop
    from devkit import envoy as e
    from devkit.topology import Pool, Topology, bootstrap
    from devkit.valkey import ValkeyServer

    work = Path(tempfile.mkdtemp(prefix="bench-aa-"))
    loads: list[float] = []
    with ValkeyServer() as valkey:
        body, port, backend = echo_pool(work)
        procs, eps = [backend], []
        try:
            for name, ha in (("alone", ()), *((f"shared-{i}", ("--ha-mode", "active-active",
                             "--state-store", valkey.url)) for i in range(2))):
                proc, ep = start_extproc(work, f"epp-{name}", epp_cmd(work, *ha))
                procs.append(proc)
                eps.append(ep)
            for grpc, _ in eps:
                e.wait_for_port(grpc, timeout=60)
            e.wait_for_port(port, timeout=60, host=PODS[0])
            admin, listen = e.free_port(), {name: e.free_port() for name in (ONE, SHARED, PAIR)}
            layouts: Any = ((ONE, "one", eps[0], []), (SHARED, "shared", eps[1], []),
                       (PAIR, "pair", eps[1], eps[1:]))
            cfg = bootstrap([Topology(listen=listen[n], admin=admin, name=k, pools=[Pool(
                k, cluster="pool", epp_cluster=f"epp-{k}", epp_port=ep[0],
                endpoints=[(ip, port) for ip in PODS], epp_replicas=reps)])
                for n, k, ep, reps in layouts])
            pids = {ONE: [procs[1].pid], SHARED: [procs[2].pid, procs[3].pid],
                    PAIR: [procs[2].pid, procs[3].pid]}

            def measure(rnd: int, name: str) -> dict[str, Any]:
                stats = cpu_load(f"http://127.0.0.1:{listen[name]}/v1/chat/completions", body,
                                 concurrency, seconds, [*pids[name], valkey.pid or 0])
                loads.append(os.getloadavg()[0])
                used, n = stats["cpu"], max(1, stats["requests"])
                r = {**{k: stats[k] for k in ("rps", "errors", "requests", "wall")},
                     "epp_cpu": used[:-1], "epp_ms": 1000 * sum(used[:-1]) / n,
                     "valkey_ms": 1000 * used[-1] / n}
                print(f"round {rnd + 1} {name:22s} {r['rps']:7.0f} req/s, EPP CPU "
                      f"{r['epp_ms']:.3f} ms/req, Valkey {r['valkey_ms']:.3f} ms/req, "
                      f"errors {r['errors']}, load {loads[-1]:.1f}", file=sys.stderr, flush=True)
                return r

            with e.Envoy(cfg, admin_port=admin, workdir=work / "envoy"):
                res = interleaved([ONE, SHARED, PAIR], rounds, measure)
        finally:
            stop(procs)
    return {"rounds": res, "loads": loads}


def active_active_report(out: dict[str, Any], a: argparse.Namespace) -> list[str]:
    from bench.stats import bootstrap_median, verdict

    res, loads = out["rounds"], out["loads"]
    lines = [f"Closed loop, {a.concurrency} connections, {a.seconds:g} s x {a.rounds} rounds "
             "per contender (interleaved), 0.9 KB chat body, 4 pods answering at once; 1-min "
             f"load average during the rounds {min(loads):.1f}-{max(loads):.1f}.", "",
             "| contender | req/s | EPP CPU ms / request | Valkey CPU ms / request | errors |",
             "|---|---|---|---|---:|"]
    for name, rs in res.items():
        lines.append(f"| {name} | " + " | ".join(str(bootstrap_median([r[k] for r in rs]))
                                                  for k in ("rps", "epp_ms", "valkey_ms"))
                     + f" | {sum(r['errors'] for r in rs)} |")

    def paired(x: str, y: str, k: str) -> Any:
        return bootstrap_median([p[k] / q[k] for p, q in zip(res[x], res[y], strict=True)
                                 if q[k] > 0])

    rps, cpu, pair = paired(SHARED, ONE, "rps"), paired(SHARED, ONE, "epp_ms"), \
        paired(PAIR, ONE, "rps")
    return [
        *lines, "", "Paired by round (median [95% bootstrap interval]):", "",
        f"- req/s, 1 replica + Valkey / no store: {rps} (cost <= 10%: target >= 0.9): "
        f"**{verdict(rps, 0.9, at_most=False)}**",
        f"- EPP CPU per request, + Valkey / no store (both replicas' CPU, the idle one "
        f"syncing): {cpu} (target <= 1.1): **{verdict(cpu, 1.1, at_most=True)}**",
        f"- req/s, 2 replicas / 1 replica without store: {pair} (target >= 1.7 where the "
        f"cores exist; this machine has {os.cpu_count()}): "
        f"**{verdict(pair, 1.7, at_most=False)}**"]


def active_active_rounds(out: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    """What ``bench.twin.cpu.load_rounds`` reads: per round the store-less EPP's and the
    serving sharing replica's CPU ms per request (their background work included), and for
    the record the idle peer's CPU per wall second and the pair's."""
    res, loads = out["rounds"], out["loads"]
    rounds = [{"none_ms": round(1000 * one["epp_cpu"][0] / max(1, one["requests"]), 4),
               "shared_ms": round(1000 * sh["epp_cpu"][0] / max(1, sh["requests"]), 4),
               "idle_peer_core": round(sh["epp_cpu"][1] / sh["wall"], 5),
               "pair_ms": round(pair["epp_ms"], 4),
               "rps": {ONE: round(one["rps"], 1), SHARED: round(sh["rps"], 1),
                       PAIR: round(pair["rps"], 1)}}
              for one, sh, pair in zip(res[ONE], res[SHARED], res[PAIR], strict=True)]
    return {"command": f"python -m bench.micro active-active --seconds {a.seconds:g} "
                       f"--rounds {a.rounds} --concurrency {a.concurrency}",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average": [round(min(loads), 1), round(max(loads), 1)],
            "cpus": os.cpu_count(), "rounds": rounds}


# -- pick, slo-pick ---------------------------------------------------------------------------
def _pcts(xs: list[float], digits: int = 0) -> str:
    """p50 and p99 of ``xs`` (seconds) in microseconds (``bench.stats.quantile``)."""
    from bench.stats import quantile

    return ", ".join(f"p{q:g} {quantile(xs, q / 100) * 1e6:.{digits}f} us" for q in (50, 99))


def director(n: int = 3, config: str | None = None, rng: random.Random | None = None) -> Any:
    """The runtime of ``config`` (default profile if None) over an ``n``-endpoint pool whose
    metrics never go stale: idle, or random load drawn from ``rng`` when one is given."""
    from devkit.manifests import pool_manifests
    from epp.config import build, parse_config
    from epp.datastore import Datastore, EndpointMetrics
    from epp.datastore.objects import parse_object
    from epp.datastore.snapshot import build_snapshot
    from epp.requestcontrol import Director

    pods = [(f"pod-{i}", f"10.8.{i // 256}.{i % 256}") for i in range(n)]
    objects = [parse_object(d) for d in pool_manifests("pool", pods, 8000)]
    store = Datastore()
    store.replace(build_snapshot([o for o in objects if o is not None], pool_name="pool",
                                 pool_namespace="default"))
    for view in store.views():
        view.begin_scrape()
        w, r, kv = (rng.randrange(0, 5), rng.randrange(0, 64), rng.random()) if rng else (0, 0, 0.0)
        store.record_scrape(view, EndpointMetrics(waiting=w, running=r, kv_usage=kv,
                                                  updated_at=time.monotonic() + 3600))
    return Director.of(build(parse_config(config), store, rng=rng or random.Random(0)))


def pick_samples(n: int, requests: int, clock: str) -> list[float]:
    """Seconds per ``schedule`` of the default profile over ``n`` endpoints with random load
    (``clock``: ``wall`` or ``cpu``, this process's CPU time, which other work inflates far
    less); ~2 KB prompts from 50 shared prefixes, each pick followed by ``post_pick`` and an
    in-flight start."""
    from epp.config import build_scheduler, parse_config
    from epp.datastore import Endpoint, EndpointMetrics, EndpointView
    from epp.scheduling import LLMRequest

    now = time.perf_counter if clock == "wall" else time.process_time
    rng = random.Random(1)
    views = []
    for i in range(n):
        v = EndpointView(Endpoint(name=f"pod-{i}-rank-0", pod_name=f"pod-{i}",
                                  namespace="default", port=8000, rank=0, labels={"app": "vllm"},
                                  address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"))
        v.apply_scrape(EndpointMetrics(waiting=rng.randrange(0, 10), running=rng.randrange(0, 64),
                                       kv_usage=rng.random(), updated_at=time.monotonic()))
        views.append(v)
    scheduler = build_scheduler(parse_config(None), rng=random.Random(2))
    prefixes = [(f"system prompt {k} " * 60).encode()[:1500] for k in range(50)]
    samples: list[float] = []
    for i in range(requests):
        prompt = rng.choice(prefixes) + f" question {i} ".encode() * 30
        req = LLMRequest(request_id=str(i), target_model="m", client_model="m", prompt=prompt,
                         prompt_tokens=len(prompt) // 4)
        t0 = now()
        result = scheduler.schedule(req, views)
        samples.append(now() - t0)
        scheduler.post_pick(req, result)
        result.endpoints[0].start_request(req.prompt_tokens)
        if i % 4 == 0:  # keep the in-flight counts bounded, as responses would
            rng.choice(views).end_request(0)
    return samples


def route_samples(d: Any, n: int, rng: random.Random | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds per ``route`` of ``n`` requests through director ``d`` (each then finished);
    with ``rng``, ~1.6 KB prompts from 50 prefixes with a random SLO header, else ~1 KB."""
    import orjson

    out = []
    for i in range(n):
        headers = {":path": "/v1/completions"}
        if rng:
            headers |= {"x-request-id": f"r{i}",
                        "x-slo-ttft-ms": str(rng.choice((200, 500, 2000)))}
        prompt = f"{i % 50} " * 400 if rng else f"shared system prompt {i % 50} " * 40
        t0 = clock()
        _, routed = d.route(headers, orjson.dumps({"model": "m", "prompt": prompt}), {})
        out.append(clock() - t0)
        d.finish(routed, completed=True, status=200, response_size=100, prompt_tokens=10,
                 completion_tokens=5)
    return out


def pick(a: argparse.Namespace) -> int:
    """p50/p99 of a pick at 10 / 100 / 1,000 endpoints; ``--route``: the director's CPU time
    per request (route + finish, 3 idle endpoints), best of the rounds."""
    if a.route:
        d = director()
        rounds = [sum(route_samples(d, a.requests or 3000, clock=time.process_time))
                  / (a.requests or 3000) * 1e6 for _ in range(a.rounds)]
        print(f"route+finish CPU time: best {min(rounds):.1f} us/request "
              f"(rounds {', '.join(f'{r:.1f}' for r in rounds)})")
        return 0
    for n in (10, 100, 1000):
        print(f"endpoints={n:5d}  " + _pcts(pick_samples(n, a.requests or 5000, a.clock), 1))
    return 0


def slo_pick(a: argparse.Namespace) -> int:
    """The director's whole request path at ``--endpoints``: default profile; upstream's
    predicted-latency profile (bench/scenarios/configs/slo-p90.yaml) with its model idle,
    then while it refits on 5,000 samples every 100 ms (10x the default schedule; the fit in
    the plugin's worker process) until ``--fits`` fits have run beside the picks."""
    from bench.scenario import SCENARIOS
    from epp.latency.predictor import EndpointState
    from epp.requestcontrol.plugins.predicted_latency_producer import PredictedLatencyProducer

    rng = random.Random(0)
    base = director(a.endpoints, None, rng)
    route_samples(base, 300, rng)
    default = route_samples(base, a.requests, rng)
    d = director(a.endpoints, (SCENARIOS / "configs" / "slo-p90.yaml").read_text(), rng)
    (producer,) = d.runtime.handle.find(PredictedLatencyProducer)
    p = producer.predictor
    p.stop()  # this bench schedules the fits itself
    for _ in range(5000):
        s = EndpointState(rng.uniform(10, 4000), rng.uniform(0, 4000), rng.randrange(5),
                          rng.randrange(64), rng.random(), rng.uniform(0, 1e5),
                          rng.uniform(0, 1e4))
        p.observe(s, 0.05 + s.uncached_tokens * 2.5e-4, 0.012 + s.running * 1e-4)
    p.retrain()
    route_samples(d, 300, rng)  # warm-up
    idle = route_samples(d, a.requests, rng)
    stop, before = threading.Event(), p.retrains

    def trainer() -> None:
        while not stop.wait(0.1):  # 10x the default schedule (retrainInterval 1s)
            p.observe(EndpointState(100, 100, 0, 1, 0.1, 100, 0), 0.08, 0.013)
            p.retrain()

    t = threading.Thread(target=trainer, daemon=True)
    t.start()
    busy = route_samples(d, a.requests, rng)  # and on until --fits fits ran beside the picks
    while p.retrains - before < a.fits:
        busy += route_samples(d, 200, rng)
    stop.set()
    t.join()
    print(f"{a.endpoints} endpoints, route() in process: default profile {_pcts(default)}; "
          f"latency profile, model idle {_pcts(idle)}; "
          f"retraining ({p.retrains - before} fits during the phase) {_pcts(busy)}")
    return 0


# -- rewrite -----------------------------------------------------------------------------------
REWRITE_TARGET, REWRITE_CLIENT = "food-review-v1", "food-review"


def sse_chunks(n: int, *, spaced: bool, model: str = REWRITE_TARGET) -> list[bytes]:
    """``n`` vLLM-shaped chat chunk events (~330 B), 4 per Envoy chunk; ``spaced``: JSON with
    spaces (``"model": "x"``) instead of vLLM's compact JSON."""
    import orjson

    events = []
    for i in range(n):
        text = orjson.dumps({"id": "chatcmpl-6f1c", "object": "chat.completion.chunk",
                             "created": 1767225600, "model": model, "choices": [{
                                 "index": 0, "delta": {"content": f" token{i}"},
                                 "logprobs": None, "finish_reason": None}]})
        if spaced:
            text = text.replace(b'":', b'": ').replace(b',"', b', "')
        events.append(b"data: " + text + b"\n\n")
    return [b"".join(events[i:i + 4]) for i in range(0, n, 4)]


def rewrite(a: argparse.Namespace) -> int:
    """CPU time (best round) per event of the EPP's ``ResponseRewriter`` renaming ``model``
    back in an SSE stream, on compact, spaced and nothing-to-rename streams."""
    from epp.requestcontrol.response import ResponseRewriter

    print(f"{'stream':<20} {'us/event':>9}")
    for name, stream in (("compact (vLLM)", sse_chunks(a.events, spaced=False)),
                         ("spaced", sse_chunks(a.events, spaced=True)),
                         ("nothing to rename", sse_chunks(a.events, spaced=False,
                                                          model="other-model"))):
        best = float("inf")
        for _ in range(a.rounds):
            rw, t0 = ResponseRewriter(REWRITE_CLIENT, REWRITE_TARGET), time.process_time()
            for chunk in stream:
                rw.chunk(chunk, False)
            best = min(best, time.process_time() - t0)
        print(f"{name:<20} {best / a.events * 1e6:>9.3f}")
    return 0


# -- rss ---------------------------------------------------------------------------------------
def rss_measure(runtime: dict[str, Any] | None, seconds: float, concurrency: int
            ) -> dict[str, Any]:
    """Bytes of RSS per request for each service, and the run's request and error counts."""
    import orjson

    from bench.harness import load, service_pids, sim_gateway
    from devkit.reliability.faultkit import MODEL
    from devkit.reliability.gateway import rss_kb

    with sim_gateway("rss-per-request-", runtime=runtime) as gw:
        body = gw.workdir / "body.json"
        body.write_bytes(orjson.dumps({"model": MODEL, "max_tokens": 2, "prompt": "leak probe"}))
        pids = {k: v for k, v in service_pids(gw).items() if k != "envoy"}
        load(gw.url(), body, concurrency, seconds / 4)
        before = {name: rss_kb(pid) for name, pid in pids.items()}
        stats = load(gw.url(), body, concurrency, seconds)
        after = {name: rss_kb(pid) for name, pid in pids.items()}
    n = max(1, stats["requests"])
    return {"requests": stats["requests"], "errors": stats["errors"],
            **{name: (after[name] - before[name]) * 1024 / n for name in pids}}


async def queued_rss(n: int, body_bytes: int, workdir: Path) -> dict[str, Any]:
    """The EPP's RSS before, with ``n`` ext_proc streams queued by flow control (its one
    endpoint, ``bench.echo_backend --saturated``, reports saturation, so all wait), and after
    they are cancelled; twice, so the second round shows whether the memory freed by the first
    is reused."""
    import grpc
    import orjson
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    from bench.harness import start, stop
    from devkit.envoy import free_port, wait_for_port
    from devkit.manifests import pool_manifests, write_yaml
    from devkit.reliability.gateway import ServiceProcess, rss_kb

    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start([sys.executable, "-m", "bench.echo_backend", "--port", str(port),
                    "--saturated"], workdir / "metrics.log")
    await asyncio.to_thread(wait_for_port, port)
    manifests = workdir / "pool.yaml"
    write_yaml(manifests, pool_manifests("pool", [("pod-0", "127.0.0.1")], port))
    config = (f"featureGates: [flowControl]\nflowControl: {{maxRequests: {n * 2}}}\n")
    epp = ServiceProcess("epp.main", "--manifests", str(manifests), "--secure-serving=false",
                         "--config-text", config, log_path=workdir / "epp.log").start()
    try:
        await asyncio.to_thread(epp.wait_serving)
        assert epp.proc is not None
        pid = epp.proc.pid

        async def queued() -> int:
            status, body = await asyncio.to_thread(epp.get, "/debug/pool")
            return int(orjson.loads(body).get("flowControl", {}).get("queued", -1)) \
                if status == 200 else -1

        prompt = ("abc " * (body_bytes // 4))[:body_bytes]
        payload = orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 16})
        # 20 connections (no shared subchannel), as several Envoys would open. All 10,000
        # streams are opened at once: before shared.server raised gRPC core's backlog of
        # streams not yet taken up by the server's loop (PENDING_STREAMS_SOFT), core
        # cancelled 10-25% of them and the queue stopped at 6-9k.
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{epp.port}",
                                              options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(20)]

        def messages(i: int) -> list[Any]:
            hdrs = [(":method", "POST"), (":path", "/v1/completions"),
                    ("content-type", "application/json"), ("x-request-id", f"q{i}")]
            return [pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs]))),
                    pb.ProcessingRequest(request_body=pb.HttpBody(body=payload,
                                                                  end_of_stream=True))]

        await asyncio.sleep(1.0)
        before = rss_kb(pid)
        rounds = []
        for r in range(2):  # the second round shows whether freed memory is reused
            calls = []
            for i in range(n):
                stub = pb_grpc.ExternalProcessorStub(channels[i % len(channels)])
                calls.append(stub.Process(iter(messages(r * n + i))))
                if i % 500 == 499:
                    await asyncio.sleep(0)
            deadline = time.monotonic() + 300
            while (q := await queued()) < n and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(2.0)
            with_queue = rss_kb(pid)
            failed = sum(1 for c in calls if c.done())  # ended while all should wait
            for c in calls:
                c.cancel()
            deadline = time.monotonic() + 120
            while await queued() > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(2.0)
            rounds.append({"queued_seen": q, "streams_ended_early": failed,
                           "rss_queued_mib": with_queue / 1024,
                           "rss_after_cancel_mib": rss_kb(pid) / 1024,
                           "queued_after_cancel": await queued()})
        for ch in channels:
            await ch.close()
        first = rounds[0]
        return {"requests": n, "body_bytes": len(payload), "rss_before_mib": before / 1024,
                **first, "kib_per_queued": (first["rss_queued_mib"] * 1024 - before)
                / max(1, first["queued_seen"]), "second_round": rounds[1],
                "alive": epp.proc.poll() is None}
    finally:
        epp.stop()
        stop([server])


def rss(a: argparse.Namespace) -> int:
    """RSS per request of BBR and the EPP, Envoy's default close against graceful close;
    ``--queued N``: the EPP's RSS with N requests queued by flow control."""
    from devkit.envoy import GRACEFUL_CLOSE

    if a.queued:
        res = asyncio.run(queued_rss(a.queued, a.body_bytes,
                                     Path(tempfile.mkdtemp(prefix="epp-queued-rss-"))))
        print(json.dumps(res, indent=1))
        return 0
    default = rss_measure(None, a.seconds, a.concurrency)
    graceful = rss_measure(GRACEFUL_CLOSE, a.seconds, a.concurrency)
    print(f"Closed loop, {a.concurrency} connections, {a.seconds:g} s measured after "
          f"{a.seconds / 4:g} s of warm-up; requests: {default['requests']} (Envoy default), "
          f"{graceful['requests']} (graceful close); errors: {default['errors']}, "
          f"{graceful['errors']}.\n")
    print("| service | Envoy default, B/request | graceful close, B/request |")
    print("|---|---:|---:|")
    for name in ("bbr", "epp"):
        print(f"| {name} | {default[name]:.0f} | {graceful[name]:.0f} |")
    return 1 if default["errors"] or graceful["errors"] else 0


def kv_index_cmd(a: argparse.Namespace) -> int:
    kv_memory(a.quick)
    if not a.memory_only:
        kv_index(a.quick)
        asyncio.run(kv_sockets(a.quick, a.central))
    return 0


def statestore_cmd(a: argparse.Namespace) -> int:
    import structlog

    # the stores' join/leave lines go to stderr so stdout is only the report
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    res = asyncio.run(statestore(a.ops, a.repeats))
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        statestore_report(res)
    return 0


def active_active_cmd(a: argparse.Namespace) -> int:
    out = active_active(a.seconds, a.rounds, a.concurrency)
    print("\n".join(active_active_report(out, a)))
    if a.save is not None:
        a.save.write_text(json.dumps(active_active_rounds(out, a), indent=1) + "\n")
    return 1 if any(r["errors"] for rs in out["rounds"].values() for r in rs) else 0


#: subcommand -> (help, its flags as (flag, add_argument keywords), what runs it)
Flags = tuple[tuple[str, dict[str, Any]], ...]

COMMANDS: dict[str, tuple[str, Flags, Callable[[argparse.Namespace], int]]] = {
    "kv-index": ("epp.kvcache: indexing, score, sockets, memory", (
        ("--quick", {"action": "store_true"}), (
        "--memory-only", {"action": "store_true", "help": "only the memory bound"}), (
        "--central", {"action": "store_true", "help": "the sockets part in llm-d's "
                      "centralized mode (a bound collector)"})), kv_index_cmd),
    "statestore": ("state store: request path, round trip, sync", (
        ("--ops", {"type": int, "default": 20_000, "help": "calls per timed batch"}),
        ("--repeats", {"type": int, "default": 7, "help": "batches per figure"}),
        ("--json", {"action": "store_true", "help": "print JSON instead of a table"})),
        statestore_cmd),
    "active-active": ("req/s and CPU of 1 vs 1 sharing vs 2 replicas", (
        ("--seconds", {"type": float, "default": 5.0}),
        ("--rounds", {"type": int, "default": 5}),
        ("--concurrency", {"type": int, "default": 32}),
        ("--save", {"type": Path, "default": None, "metavar": "FILE", "help": "write the CPU "
                    "figures per round for the twin (bench.twin.cpu)"})), active_active_cmd),
    "pick": ("pick latency at 10/100/1,000 endpoints; --route: the director's CPU", (
        ("--requests", {"type": int, "default": None,
                        "help": "picks per pool size (5000), with --route per round (3000)"}),
        ("--route", {"action": "store_true", "help": "time route + finish instead"}),
        ("--rounds", {"type": int, "default": 7, "help": "with --route"}),
        ("--clock", {"choices": ("wall", "cpu"), "default": "wall",
                     "help": "time picks by wall clock or by this process's CPU time"})), pick),
    "slo-pick": ("route() with the predicted-latency profile, idle and refitting", (
        ("--requests", {"type": int, "default": 3000}),
        ("--endpoints", {"type": int, "default": 100}),
        ("--fits", {"type": int, "default": 10,
                    "help": "keep picking while refitting until this many fits ran"})),
        slo_pick),
    "rewrite": ("CPU per SSE event to rename the model back", (
        ("--events", {"type": int, "default": 20000}),
        ("--rounds", {"type": int, "default": 7})), rewrite),
    "rss": ("RSS per request through the gateway; --queued N: the EPP with N queued", (
        ("--seconds", {"type": float, "default": 60.0}),
        ("--concurrency", {"type": int, "default": 32}),
        ("--queued", {"type": int, "default": 0, "help": "measure the EPP with N queued"}),
        ("--body-bytes", {"type": int, "default": 3200,
                          "help": "--queued: prompt bytes per queued request (~800 tokens)"})),
        rss),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.micro", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, (text, flags, _) in COMMANDS.items():
        p = sub.add_parser(name, help=text)
        for flag, kw in flags:
            p.add_argument(flag, **kw)
    a = ap.parse_args(argv)
    return COMMANDS[a.cmd][2](a)


if __name__ == "__main__":
    sys.exit(main())
