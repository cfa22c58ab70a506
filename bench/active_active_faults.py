"""Faults under load for active-active EPP replicas (issue 18's last bullet;
docs/active-active.md).

Two sharing replicas (``bench.contenders.EppReplicas``, a real Valkey, one Envoy ext_proc
cluster) in front of a fresh simulated fleet, the shared-prefix schedule played open loop,
and one fault per run:

- ``replica``: replica 0 SIGKILLed at 40% of the schedule. Just before, its own requests in
  flight are read from its ``/debug/pool`` (what it counts in flight minus the other
  replica's part): those streams break with it. The figure is the client errors beyond them.
- ``valkey``: Valkey SIGKILLed at 1/3 of the schedule and restarted (empty) at 2/3. Client
  errors (the target is 0) and the prefix-cache hit rate of the requests sent before, during
  and after the outage.
- ``none``: the same run without a fault, so the phases' hit rates have a reference.

    python -m bench.active_active_faults [--seeds 0,1,2] [--faults replica,valkey,none]
                                         [--duration 30] [--load 0.5] [--servers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.compare import RUNS
from bench.contenders import EppReplicas, SimFleet
from bench.openloop import Outcome
from bench.openloop import run as play
from bench.stats import bootstrap_median
from bench.workloads import WORKLOADS

FAULTS = ("replica", "valkey", "none")


@dataclass
class FaultRun:
    fault: str
    seed: int
    requests: int = 0
    errors: int = 0
    #: replica fault: the killed replica's own requests in flight just before the kill, and
    #: the failed requests sent after the kill (new streams that still reached it)
    in_flight_on_killed: int = 0
    errors_sent_after_kill: int = 0
    #: seconds from the start of the in-flight read to the kill
    read_to_kill: float = 0.0
    #: hit rate (cached / prompt tokens) of the ok requests sent before/during/after
    hit: dict[str, float] = field(default_factory=dict)
    load: float = 0.0
    error_samples: list[str] = field(default_factory=list)

    @property
    def beyond(self) -> int:
        return max(0, self.errors - self.in_flight_on_killed)


def own_in_flight(debug: Mapping[str, Any]) -> int:
    """Requests a replica has in flight itself (``/debug/pool``: all minus the others')."""
    endpoints = debug.get("endpoints", [])
    return sum(int(ep.get("inflight_requests", 0)) - int(ep.get("remote_inflight_requests", 0))
               for ep in endpoints)


def hit_rate(outcomes: list[Outcome]) -> float:
    ok = [o for o in outcomes if o.ok]
    prompt = sum(o.prompt_tokens for o in ok)
    return sum(o.cached_tokens for o in ok) / prompt if prompt else 0.0


def one_run(fault: str, seed: int, args: argparse.Namespace, run_dir: Path) -> FaultRun:
    wl = WORKLOADS["shared-prefix"]
    specs = wl.schedule(args.load, args.duration, seed, args.servers)
    span = max(s.at for s in specs)
    result = FaultRun(fault, seed)
    contender = EppReplicas("epp-2-shared", 2, "valkey")
    workdir = run_dir / str(seed) / fault
    workdir.mkdir(parents=True, exist_ok=True)
    with SimFleet(workdir / "fleet", size=args.servers, seed=seed) as fleet, \
            contender.running(fleet, workdir) as url:
        valkey = contender.valkey
        assert valkey is not None
        victim = contender.procs[0]
        marks: dict[str, float] = {}
        t0 = time.perf_counter() + 0.05   # bench.openloop's t0, within a millisecond

        def at(offset: float, action: Callable[[], None], mark: str) -> None:
            time.sleep(max(0.0, t0 + offset - time.perf_counter()))
            action()
            marks[mark] = time.perf_counter() - t0

        def kill_replica() -> None:
            # The read takes milliseconds on an idle machine, up to a second or more under
            # heavy load: streams opened meanwhile are not counted (the gap is reported).
            marks["read"] = time.perf_counter() - t0
            result.in_flight_on_killed = own_in_flight(contender._replicas[0].debug())
            os.kill(victim.pid, signal.SIGKILL)

        steps: list[tuple[float, Callable[[], None], str]] = {
            "replica": [(0.4 * span, kill_replica, "kill")],
            "valkey": [(span / 3, valkey.kill, "kill"), (2 * span / 3, valkey.start, "restart")],
            "none": [],
        }[fault]

        def inject() -> None:
            for offset, action, mark in steps:
                at(offset, action, mark)

        thread = threading.Thread(target=inject, daemon=True)
        thread.start()
        outcomes = asyncio.run(play(url, [{"at": s.at, "path": s.path, "body": s.body,
                                           "headers": s.headers} for s in specs],
                                    timeout=args.timeout))
        thread.join()
    result.load = os.getloadavg()[0]
    result.requests = len(outcomes)
    result.errors = sum(1 for o in outcomes if not o.ok)
    result.error_samples = sorted({o.error or f"HTTP {o.status}"
                                   for o in outcomes if not o.ok})[:3]
    if fault == "replica":
        result.errors_sent_after_kill = sum(1 for o in outcomes
                                            if not o.ok and o.start >= marks["kill"])
        result.read_to_kill = marks["kill"] - marks["read"]
    (workdir / "outcomes.jsonl").write_bytes(b"".join(
        orjson.dumps(dataclasses.asdict(o)) + b"\n" for o in outcomes))
    if fault == "valkey":
        kill, restart = marks["kill"], marks["restart"]
    else:   # the same phases by the schedule, for the reference run
        kill, restart = span / 3, 2 * span / 3
    result.hit = {
        "before": hit_rate([o for o in outcomes if o.start < kill]),
        "during": hit_rate([o for o in outcomes if kill <= o.start < restart]),
        "after": hit_rate([o for o in outcomes if o.start >= restart]),
        "all": hit_rate(outcomes),
    }
    (workdir / "fault.json").write_text(str(dataclasses.asdict(result)) + f" marks={marks}\n")
    return result


def report(runs: list[FaultRun], args: argparse.Namespace) -> list[str]:
    loads = [r.load for r in runs]
    lines = [f"shared-prefix, load {args.load:g}, {args.duration:g} s, {args.servers} servers, "
             f"2 sharing replicas, seeds {args.seeds}; 1-min load average after each run "
             f"{min(loads):.1f}-{max(loads):.1f}.", ""]
    kills = [r for r in runs if r.fault == "replica"]
    if kills:
        lines += ["Replica 0 SIGKILLed at 40% of the schedule:", "",
                  "| seed | requests | client errors | in flight on the killed replica | "
                  "errors beyond those | failed requests sent after the kill | "
                  "read-to-kill s |", "|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r.seed} | {r.requests} | {r.errors} | {r.in_flight_on_killed} | "
                  f"{r.beyond} | {r.errors_sent_after_kill} | {r.read_to_kill:.3f} |"
                  for r in kills]
        lines.append("")
    phased = [r for r in runs if r.fault in ("valkey", "none")]
    if phased:
        lines += ["Valkey SIGKILLed at 1/3 of the schedule, restarted empty at 2/3 (`none`: no "
                  "fault, same phases); hit rate % of the requests sent in each phase:", "",
                  "| fault | seed | requests | client errors | before | during | after |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r.fault} | {r.seed} | {r.requests} | {r.errors} | "
                  f"{100 * r.hit['before']:.1f} | {100 * r.hit['during']:.1f} | "
                  f"{100 * r.hit['after']:.1f} |" for r in phased]
        for fault in ("valkey", "none"):
            rs = [r for r in phased if r.fault == fault]
            if len(rs) > 1:
                cells = [str(bootstrap_median([100 * r.hit[k] for r in rs]))
                         for k in ("before", "during", "after")]
                lines.append(f"| {fault} | median [95%] | {sum(r.requests for r in rs)} | "
                             f"{sum(r.errors for r in rs)} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.active_active_faults", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated")
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    p.add_argument("--load", type=float, default=0.5, help="fraction of fleet capacity")
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--timeout", type=float, default=90.0)
    args = p.parse_args(argv)
    faults = args.faults.split(",")
    for f in faults:
        if f not in FAULTS:
            p.error(f"--faults: unknown fault {f!r} (known: {', '.join(FAULTS)})")
    run_dir = RUNS / f"active-active-faults-{time.strftime('%Y%m%d-%H%M%S')}"
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for fault in faults:
            r = one_run(fault, seed, args, run_dir)
            runs.append(r)
            print(f"seed {seed} {fault:8s} errors {r.errors}/{r.requests} in flight on killed "
                  f"{r.in_flight_on_killed} "
                  f"{r.hit} {r.error_samples} load {r.load:.1f}", file=sys.stderr, flush=True)
    print("\n".join(report(runs, args)))
    print(f"raw: {run_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
