"""State-store latency: the request path in-process vs on Valkey, and what the sync costs.

Run: ``python -m bench.statestore_bench [--repeats 7] [--ops 20000] [--quick] [--json]``.
It starts its own Valkey (``devkit.valkey``) and reports, as the median over repeats with the
min-max across repeats:

- **request path**: one call of each synchronous method the director/scorers would use, for
  ``memory://`` and for ``valkey://`` (both local by design; the Valkey store also queues the
  write). A pick writes one in-flight count and 16 prefix blocks.
- **network round trip**: one ``HINCRBY`` and one pipelined ``HGETALL`` from the asyncio
  client — what each op would cost if the pick waited on Valkey (it does not).
- **sync**: one background ``sync()`` (push + pull) carrying the writes of 0 / 10 / 100 picks,
  wall time, this process's CPU time per sync (the client's share) and the Valkey server's CPU
  time per pick carried (from ``/proc``; CPU time, unlike wall time, is not stretched by
  other processes on a busy machine).
- **pull**: one ``sync()`` with nothing to push while another replica has requests in flight
  on 100 endpoints (its hash is read and summed).
- **propagation**: from the start of replica A's ``sync()`` until replica B's local index
  answers a prefix written on A (push, pub/sub delivery, apply).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
import valkey.asyncio as avalkey

from devkit.valkey import ValkeyServer
from epp.statestore import MemoryStateStore, StateStore, ValkeyStateStore, parse_store_url

BLOCKS = 16  # prefix blocks written and matched per pick (a ~1,000-token prompt)
ENDPOINTS = 100


def summarize(samples: list[float], cpu: list[float] | None = None) -> dict[str, float]:
    """Median and range, in microseconds (and the median CPU time of this process)."""
    out = {"median_us": statistics.median(samples) * 1e6,
           "min_us": min(samples) * 1e6, "max_us": max(samples) * 1e6}
    if cpu:
        out["cpu_median_us"] = statistics.median(cpu) * 1e6
    return out


def none(_: object) -> None:
    """Drop a result (keeps every timed op the same shape)."""


def request_path_ops(store: StateStore, ops: int) -> dict[str, Callable[[int], None]]:
    """The synchronous calls of one pick, each as ``f(i)``."""
    chains = [[(k << 20) + b for b in range(BLOCKS)] for k in range(64)]
    for k, chain in enumerate(chains):
        store.prefix_add(f"10.0.0.{k % ENDPOINTS}:8000", chain, 31_250)
    return {
        "add_inflight": lambda i: store.add_inflight(f"10.0.0.{i % ENDPOINTS}:8000", 1, 500),
        "inflight": lambda i: none(store.inflight(f"10.0.0.{i % ENDPOINTS}:8000")),
        # Chain k always lands on endpoint k, as prefix-aware routing makes it.
        "prefix_add_16": lambda i: store.prefix_add(f"10.0.0.{i % 64 % ENDPOINTS}:8000",
                                                    chains[i % 64], 31_250),
        "prefix_match_16": lambda i: none(store.prefix_match(chains[i % 64])),
        "session_set": lambda i: store.session_set(f"s{i % 1000}", "10.0.0.1:8000"),
        "session_get": lambda i: none(store.session_get(f"s{i % 1000}")),
    }


def time_per_call(fn: Callable[[int], None], ops: int) -> float:
    t0 = time.perf_counter()
    for i in range(ops):
        fn(i)
    return (time.perf_counter() - t0) / ops


async def bench_request_path(url: str, ops: int, repeats: int) -> dict[str, Any]:
    # The two stores alternate within each repeat (and swap order every repeat), so load
    # from other processes on a shared machine falls on both columns alike.
    samples: dict[str, dict[str, list[float]]] = {"memory": {}, "valkey": {}}
    for r in range(repeats):
        for kind in (("memory", "valkey") if r % 2 == 0 else ("valkey", "memory")):
            store: StateStore
            if kind == "memory":
                store = MemoryStateStore()
            else:
                store = ValkeyStateStore(parse_store_url(url), pool="bench")
                await store.start()
            for name, fn in request_path_ops(store, ops).items():
                samples[kind].setdefault(name, []).append(time_per_call(fn, ops))
                if isinstance(store, ValkeyStateStore):
                    await store.sync()  # keep the queue from growing across op kinds
            await store.close()
    return {kind: {name: summarize(s) for name, s in by_op.items()}
            for kind, by_op in samples.items()}


async def bench_round_trip(port: int, ops: int, repeats: int) -> dict[str, Any]:
    client = avalkey.Valkey(port=port)
    incr: list[float] = []
    getall: list[float] = []
    n = max(ops // 20, 50)
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(n):
            await client.execute_command("HINCRBY", "bench:rt", f"r:{i % ENDPOINTS}", 1)
        incr.append((time.perf_counter() - t0) / n)
        t0 = time.perf_counter()
        for _ in range(n):
            pipe = client.pipeline(transaction=False)
            pipe.hgetall("bench:rt")
            await pipe.execute()
        getall.append((time.perf_counter() - t0) / n)
    await client.aclose()
    return {"hincrby": summarize(incr), "hgetall_100_fields": summarize(getall)}


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_sync(url: str, server_pid: int, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    a = ValkeyStateStore(parse_store_url(url + "?sync_interval=3600"), pool="bench-sync",
                         replica="a")
    b = ValkeyStateStore(parse_store_url(url + "?sync_interval=3600"), pool="bench-sync",
                         replica="b")
    await a.start()  # alone: b's subscriber would share this process's CPU
    for picks in (0, 10, 100):
        samples, cpu = [], []
        server_cpu = process_cpu(server_pid)
        for r in range(max(repeats * 10, 4)):
            for i in range(picks):
                ep = f"10.0.0.{i % ENDPOINTS}:8000"
                a.add_inflight(ep, 1, 500)
                a.prefix_add(ep, [(r << 40) + (i << 20) + k for k in range(BLOCKS)], 31_250)
            t0, c0 = time.perf_counter(), time.process_time()
            await a.sync()
            samples.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        out[f"sync_{picks}_picks"] = summarize(samples, cpu)
        if picks:
            per_pick = (process_cpu(server_pid) - server_cpu) / (len(samples) * picks)
            out[f"sync_{picks}_picks"]["valkey_cpu_per_pick_us"] = per_pick * 1e6
    # Propagation: write on a, sync a, wait until b's local index has it.
    await b.start()
    while not b.shared:
        await asyncio.sleep(0.01)
    delays = []
    for r in range(max(repeats * 4, 4)):
        chain = [(1 << 60) + (r << 8) + k for k in range(BLOCKS)]
        a.prefix_add("10.0.0.1:8000", chain, 31_250)
        t0 = time.perf_counter()
        await a.sync()
        while not b.prefix_match(chain[:1]):
            await asyncio.sleep(0)
        delays.append(time.perf_counter() - t0)
    out["propagation"] = summarize(delays)
    # Pull: a reads b's in-flight hash (2 fields per endpoint) on every sync.
    for i in range(ENDPOINTS):
        b.add_inflight(f"10.0.0.{i}:8000", 1, 500)
    await b.sync()
    samples, cpu = [], []
    for _ in range(max(repeats * 10, 4)):
        t0, c0 = time.perf_counter(), time.process_time()
        await a.sync()
        samples.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    out[f"sync_pull_{ENDPOINTS}_endpoints"] = summarize(samples, cpu)
    await a.close()
    await b.close()
    return out


async def run(ops: int, repeats: int) -> dict[str, Any]:
    with ValkeyServer() as server:
        return {
            "request_path": await bench_request_path(server.url, ops, repeats),
            "round_trip": await bench_round_trip(server.port, ops, repeats),
            "background": await bench_sync(server.url, server.pid or 0, repeats),
            "ops": ops, "repeats": repeats,
        }


def fmt(s: dict[str, float]) -> str:
    text = f"{s['median_us']:9.2f} us  [{s['min_us']:.2f}-{s['max_us']:.2f}]"
    if "cpu_median_us" in s:
        text += f"  client cpu {s['cpu_median_us']:.0f} us"
    if "valkey_cpu_per_pick_us" in s:
        text += f"  valkey cpu/pick {s['valkey_cpu_per_pick_us']:.0f} us"
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=20_000, help="calls per timed batch")
    ap.add_argument("--repeats", type=int, default=7, help="batches per figure")
    ap.add_argument("--quick", action="store_true", help="--ops 2000 --repeats 3")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    ops, repeats = (2000, 3) if args.quick else (args.ops, args.repeats)
    # The stores' join/leave lines go to stderr so stdout is only the report.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    result = asyncio.run(run(ops, repeats))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"request path, per call (median of {repeats} batches of {ops}; [min-max])")
    print(f"{'op':18s} {'memory://':>32s} {'valkey://':>32s}")
    rp = result["request_path"]
    for name in rp["memory"]:
        print(f"{name:18s} {fmt(rp['memory'][name]):>32s} {fmt(rp['valkey'][name]):>32s}")
    print("\nnetwork round trip to Valkey on loopback, per op")
    for name, s in result["round_trip"].items():
        print(f"{name:18s} {fmt(s)}")
    print("\nbackground (never on the request path)")
    for name, s in result["background"].items():
        print(f"{name:18s} {fmt(s)}")


if __name__ == "__main__":
    main()
