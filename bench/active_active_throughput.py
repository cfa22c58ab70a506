"""What sharing costs a replica, and what a second replica adds (issue 18's throughput bullet;
docs/active-active.md).

One Envoy (built by :mod:`devkit.topology`), three listeners, the same 4 pods answering at
once (only the gateway is measured), closed loop, rounds interleaved:

- ``1 replica, no store``: an EPP with no state store (as today);
- ``1 replica + Valkey``: an active-active EPP sharing through a real Valkey with a second
  replica (which syncs but gets no traffic on this listener: its counts are pulled);
- ``2 replicas + Valkey``: both of those replicas in one ext_proc cluster.

Per round and contender: req/s, and CPU seconds per request of the EPP processes and of
Valkey (``/proc/<pid>/stat``, 10 ms ticks, over the round). Ratios are paired by round,
``median [95% bootstrap interval]`` (:mod:`bench.stats`).

``--save FILE`` writes, per round, what the replica twin's CPU model takes
(:mod:`bench.twin.cpu`): the store-less EPP's CPU per request and the serving replica of the
sharing pair's (each process's own CPU over the round, its background work included), and for
the record the idle peer's CPU per wall second.

    python -m bench.active_active_throughput [--seconds 5] [--rounds 5] [--concurrency 32]
                                             [--save FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.cpubudget import cpu_seconds
from bench.epp_overhead import PODS, echo_pool
from bench.harness import load, start, stop
from bench.stats import bootstrap_median, verdict
from devkit import envoy as e
from devkit.topology import Pool, Topology, bootstrap
from devkit.valkey import ValkeyServer

ONE, SHARED, PAIR = "1 replica, no store", "1 replica + Valkey", "2 replicas + Valkey"


@dataclass
class Round:
    rps: float
    errors: int
    epp_cpu_per_request_ms: float
    valkey_cpu_per_request_ms: float
    #: the round's requests and wall seconds, and each watched EPP's CPU seconds over it
    requests: int = 0
    wall: float = 0.0
    epp_cpu: tuple[float, ...] = ()


def epp(work: Path, name: str, store: str | None) -> tuple[subprocess.Popen[bytes], int, int]:
    grpc, health, metrics = e.free_port(), e.free_port(), e.free_port()
    cmd = [sys.executable, "-m", "epp.main", "--secure-serving=false", "--manifests",
           str(work / "pool.yaml"), "--grpc-port", str(grpc), "--grpc-health-port",
           str(health), "--metrics-port", str(metrics)]
    if store is not None:
        cmd += ["--ha-mode", "active-active", "--state-store", store]
    return start(cmd, work / f"{name}.log"), grpc, health


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.active_active_throughput",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--save", type=Path, default=None, metavar="FILE",
                   help="write the CPU figures per round for the twin (bench.twin.cpu)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-aa-"))
    results: dict[str, list[Round]] = {ONE: [], SHARED: [], PAIR: []}
    loads: list[float] = []
    with ValkeyServer() as valkey:
        body, backend_port, backend = echo_pool(work)
        pods = [(ip, backend_port) for ip in PODS]
        procs = [backend]
        try:
            alone, a_port, _ = epp(work, "epp-alone", None)
            first, b_port, b_health = epp(work, "epp-shared-0", valkey.url)
            second, c_port, c_health = epp(work, "epp-shared-1", valkey.url)
            procs += [alone, first, second]
            for port in (a_port, b_port, c_port):
                e.wait_for_port(port, timeout=60)
            e.wait_for_port(backend_port, timeout=60, host=PODS[0])
            admin = e.free_port()
            listen = {name: e.free_port() for name in results}

            def layout(name: str, key: str, grpc: int,
                       replicas: list[tuple[int, int]]) -> Topology:
                return Topology(listen=listen[name], admin=admin, name=key, pools=[Pool(
                    key, cluster="pool", epp_cluster=f"epp-{key}", epp_port=grpc,
                    endpoints=pods, epp_replicas=replicas)])

            cfg = bootstrap([layout(ONE, "one", a_port, []),
                             layout(SHARED, "shared", b_port, []),
                             layout(PAIR, "pair", b_port, [(b_port, b_health),
                                                           (c_port, c_health)])])
            watched = {ONE: [alone.pid], SHARED: [first.pid, second.pid],
                       PAIR: [first.pid, second.pid]}
            with e.Envoy(cfg, admin_port=admin, workdir=work / "envoy"):
                for rnd in range(args.rounds):
                    order = list(results) if rnd % 2 == 0 else list(reversed(results))
                    for name in order:
                        results[name].append(one_round(
                            f"http://127.0.0.1:{listen[name]}/v1/chat/completions", body, args,
                            watched[name], valkey.pid))
                        loads.append(os.getloadavg()[0])
                        r = results[name][-1]
                        print(f"round {rnd + 1} {name:22s} {r.rps:7.0f} req/s, EPP CPU "
                              f"{r.epp_cpu_per_request_ms:.3f} ms/req, Valkey "
                              f"{r.valkey_cpu_per_request_ms:.3f} ms/req, errors {r.errors}, "
                              f"load {loads[-1]:.1f}", file=sys.stderr, flush=True)
        finally:
            stop(procs)
    print("\n".join(report(results, args, loads)))
    if args.save is not None:
        args.save.write_text(json.dumps(cpu_rounds(results, args, loads), indent=1) + "\n")
    return 1 if any(r.errors for rs in results.values() for r in rs) else 0


def one_round(url: str, body: Path, args: argparse.Namespace, pids: list[int],
              valkey_pid: int | None) -> Round:
    before = [cpu_seconds(p) for p in pids]
    v_before = cpu_seconds(valkey_pid) if valkey_pid else 0.0
    t0 = time.monotonic()
    stats = load(url, body, args.concurrency, args.seconds)
    wall = time.monotonic() - t0
    used = tuple(cpu_seconds(p) - b for p, b in zip(pids, before, strict=True))
    v_used = (cpu_seconds(valkey_pid) if valkey_pid else 0.0) - v_before
    n = max(1, stats["requests"])
    return Round(stats["requests"] / stats["seconds"], stats["errors"], 1000 * sum(used) / n,
                 1000 * v_used / n, stats["requests"], wall, used)


def cpu_rounds(results: dict[str, list[Round]], args: argparse.Namespace,
               loads: list[float]) -> dict[str, object]:
    """Per round, the twin's CPU inputs (:func:`bench.twin.cpu.load_rounds` reads them).

    ``none_ms`` and ``shared_ms``: the store-less EPP's and the serving sharing replica's own
    CPU per request, each with its background work (scrapes; syncs for the sharing one) at the
    round's rate. ``idle_peer_core``: the sharing replica that got no traffic, CPU seconds per
    wall second; not the store's cost alone (it scrapes the pods too, as the store-less EPP
    does), so the model does not take it."""
    rounds = []
    for one, shared, pair in zip(results[ONE], results[SHARED], results[PAIR], strict=True):
        serving, idle = shared.epp_cpu
        rounds.append({
            "none_ms": round(1000 * one.epp_cpu[0] / max(1, one.requests), 4),
            "shared_ms": round(1000 * serving / max(1, shared.requests), 4),
            "idle_peer_core": round(idle / shared.wall, 5),
            "pair_ms": round(pair.epp_cpu_per_request_ms, 4),
            "rps": {ONE: round(one.rps, 1), SHARED: round(shared.rps, 1),
                    PAIR: round(pair.rps, 1)}})
    return {"command": "python -m bench.active_active_throughput " + " ".join(
                f"--{k} {v:g}" for k, v in (("seconds", args.seconds), ("rounds", args.rounds),
                                            ("concurrency", args.concurrency))),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average": [round(min(loads), 1), round(max(loads), 1)],
            "cpus": os.cpu_count(), "rounds": rounds}


def report(results: dict[str, list[Round]], args: argparse.Namespace,
           loads: list[float]) -> list[str]:
    lines = [f"Closed loop, {args.concurrency} connections, {args.seconds:g} s x {args.rounds} "
             "rounds per contender (interleaved), 0.9 KB chat body, 4 pods answering at once; "
             f"1-min load average during the rounds {min(loads):.1f}-{max(loads):.1f}.", "",
             "| contender | req/s | EPP CPU ms / request | Valkey CPU ms / request | errors |",
             "|---|---|---|---|---:|"]
    for name, rounds in results.items():
        lines.append(
            f"| {name} | {bootstrap_median([r.rps for r in rounds])} | "
            f"{bootstrap_median([r.epp_cpu_per_request_ms for r in rounds])} | "
            f"{bootstrap_median([r.valkey_cpu_per_request_ms for r in rounds])} | "
            f"{sum(r.errors for r in rounds)} |")

    def paired(a: str, b: str, field: str) -> list[float]:
        return [getattr(x, field) / getattr(y, field)
                for x, y in zip(results[a], results[b], strict=True) if getattr(y, field) > 0]

    rps = bootstrap_median(paired(SHARED, ONE, "rps"))
    cpu = bootstrap_median(paired(SHARED, ONE, "epp_cpu_per_request_ms"))
    # The shared replica's CPU per request includes its idle peer's syncing; per replica
    # that is the cost of sharing for a pool of two.
    pair = bootstrap_median(paired(PAIR, ONE, "rps"))
    lines += ["", "Paired by round (median [95% bootstrap interval]):", "",
              f"- req/s, 1 replica + Valkey / no store: {rps} (cost <= 10%: target >= 0.9): "
              f"**{verdict(rps, 0.9, at_most=False)}**",
              f"- EPP CPU per request, + Valkey / no store (both replicas' CPU, the idle one "
              f"syncing): {cpu} (target <= 1.1): **{verdict(cpu, 1.1, at_most=True)}**",
              f"- req/s, 2 replicas / 1 replica without store: {pair} (target >= 1.7 where "
              f"the cores exist; this machine has {os.cpu_count()}): "
              f"**{verdict(pair, 1.7, at_most=False)}**"]
    return lines


if __name__ == "__main__":
    sys.exit(main())
