"""One real-time routing run (:func:`run_one`): a fresh ``vllm-sim`` fleet (cold caches, the
seed's simulator seed), the contender started in front of it, and the open-loop client
(``bench.openloop``, its own process) playing the workload's schedule for that seed. The
scenario runner (``python -m bench run SCENARIO --real``, :mod:`bench.runner`) and the
benchmarks that are not scenarios yet call it; :func:`load_run` reads the runs the former
``python -m bench.compare`` saved under ``.cache/bench-compare/<timestamp>/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson

from bench import cpubudget
from bench.contenders import Contender, SimFleet
from bench.openloop import Outcome
from bench.report import RunResult, summarize, tenant_fairness
from bench.scenario import Fault
from bench.workloads import PROFILE, Workload, write_specs

ROOT = Path(__file__).resolve().parent
RUNS = ROOT.parent / ".cache" / "bench-compare"


def run_one(workload: Workload, load: float, contender: Contender, *, duration: float,
            seed: int, servers: int, time_scale: float, workdir: Path, progress: bool,
            timeout: float, fleet_cpus: float = 0.0, client_cpus: float = 0.0,
            profile: str = PROFILE, labels: list[dict[str, str]] | None = None,
            faults: Sequence[Fault] = (), kv_blocks: int = 0,
            kv_events: bool = False) -> RunResult:
    """One run: fresh fleet, contender in front, the seed's schedule played open-loop;
    ``fleet_cpus`` / ``client_cpus``: CPU budgets of the simulator and the client (0: none);
    ``labels``: each server's extra pod labels; ``faults``: steps done at their model time
    from the client's start (what each did goes to ``faults.txt`` in ``workdir``);
    ``kv_blocks``, ``kv_events``: :class:`SimFleet`'s."""
    specs = workload.schedule(load, duration, seed, servers)
    res = RunResult(workload.name, load, load * workload.capacity(servers), contender.name,
                    contender.kind, seed=seed, servers=servers)
    reason = contender.unavailable()
    if reason:
        res.skipped = reason
        return res
    workdir.mkdir(parents=True, exist_ok=True)
    # The schedule is in model seconds; the simulator runs time_scale x slower than a GPU.
    specs = [dataclasses.replace(s, at=s.at * time_scale) for s in specs]
    write_specs(specs, workdir / "requests.jsonl")
    started = time.monotonic()
    with SimFleet(workdir / "fleet", size=servers, time_scale=time_scale, seed=seed,
                  cpus=fleet_cpus, profile=profile, labels=labels or [], kv_blocks=kv_blocks,
                  kv_events=kv_events) as fleet, \
            contender.running(fleet, workdir) as url:
        cmd = [sys.executable, "-m", "bench.openloop", "--url", url,
               "--requests", str(workdir / "requests.jsonl"),
               "--out", str(workdir / "outcomes.jsonl"), "--timeout", str(timeout)]
        if progress:
            cmd.append("--progress")
        with contextlib.ExitStack() as stack:
            client = subprocess.Popen(cmd)
            stack.callback(client.kill)   # only if this block fails before it ends
            if faults:
                stack.enter_context(_faults(contender, faults, time_scale, workdir, fleet))
            if client_cpus:
                stack.enter_context(cpubudget.CpuBudget(client_cpus)).add(client.pid)
            if client.wait() != 0:
                raise subprocess.CalledProcessError(client.returncode, cmd)
        res.evictions, res.kv_lag = fleet.evictions(), contender.kv_lag()
        debug = contender.debug()
        if debug:
            (workdir / "debug.json").write_text(json.dumps(debug, indent=1))
    res.wall_seconds = time.monotonic() - started
    res.router_cpu, res.router_throttled = contender.cpu_used, contender.throttled
    outcomes = [Outcome(**dict(orjson.loads(line).items()))
                for line in (workdir / "outcomes.jsonl").read_bytes().splitlines()]
    summarize(res, outcomes, time_scale,
              tags=[s.tag for s in specs] if workload.by_class else None)
    if workload.generator == "tenants":
        res.jain = tenant_fairness(specs, outcomes, duration, time_scale)
    return res


@contextlib.contextmanager
def _faults(contender: Contender, faults: Sequence[Fault], time_scale: float,
            workdir: Path, fleet: SimFleet | None = None) -> Iterator[None]:
    """The fault steps on a thread, timed from now (the client's start, within its import
    time: a fraction of a second); ``restart-server`` acts on ``fleet``, the rest on the
    contender."""
    t0, stop, done = time.monotonic(), threading.Event(), []

    def steps() -> None:
        for f in sorted(faults, key=lambda f: f.at):
            if stop.wait(max(0.0, t0 + f.at * time_scale - time.monotonic())):
                return
            did = (fleet.restart(0) if f.action == "restart-server" and fleet is not None
                   else contender.fault(f.action))
            done.append(f"{time.monotonic() - t0:.2f} s: {did}")

    thread = threading.Thread(target=steps, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        (workdir / "faults.txt").write_text("".join(line + "\n" for line in done))


def load_run(run_dir: Path) -> tuple[dict[str, object], list[RunResult]]:
    """A saved run's meta and results."""
    saved = json.loads((run_dir / "results.json").read_text())
    return saved["meta"], [RunResult(**r) for r in saved["results"]]
