"""Routing comparison: every contender in front of the same simulated fleet, same requests,
repeated over seeds.

    python -m bench.compare                    # full run: 5 seeds x 8 servers, RESULTS.md
    python -m bench.compare --quick            # CI smoke: one short run per contender, < 90 s
    python -m bench.compare --workloads shared-prefix --loads 0.75 --seeds 3 \
        --contenders envoy-rr,epp-tuned

For each workload, offered load and seed, each contender gets one run: a fresh ``vllm-sim``
fleet (cold caches, the seed's simulator seed), the contender started in front of it, and the
open-loop client (``bench.openloop``, its own process) playing the workload's schedule for
that seed. Every contender gets the same seeds, so ratios are paired by seed. The order of
the contenders alternates between runs so slow drift of the shared machine does not always
hit the same one. Each run is summarised without its first 20% of requests (the cold start,
reported apart); tables show medians over seeds and paired ratios with 95% bootstrap
intervals; a target is met only when its whole interval is on the right side
(:mod:`bench.report`, :mod:`bench.stats`).

Raw per-request outcomes and logs stay under ``.cache/bench-compare/<timestamp>/`` (with
``results.json`` rewritten after every run, so a stopped run can still be reported with
``--report-only``); the full run writes ``bench/plots/compare_*.png`` and the
"## Routing comparison" section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import orjson

from bench import cpubudget
from bench import report as rp
from bench.contenders import Contender, SimFleet, all_contenders
from bench.openloop import Outcome
from bench.report import RunResult, summarize
from bench.workloads import PROFILE, WORKLOADS, Workload, write_specs

ROOT = Path(__file__).resolve().parent
RUNS = ROOT.parent / ".cache" / "bench-compare"
SECTION = "## Routing comparison"
#: The contenders of the full run (the others run when named with --contenders).
FULL_RUN = ("envoy-rr", "envoy-lr", "epp-default", "epp-tuned", "vllm-router:cache_aware",
            "sglang-router:cache_aware")
#: The full run's workloads and load (the issue's matrix); --workloads/--loads widen it.
FULL_WORKLOADS, FULL_LOAD = ("shared-prefix", "lora", "bursts", "sharegpt"), 0.75


def run_one(workload: Workload, load: float, contender: Contender, *, duration: float,
            seed: int, servers: int, time_scale: float, workdir: Path, progress: bool,
            timeout: float, fleet_cpus: float = 0.0, client_cpus: float = 0.0,
            profile: str = PROFILE) -> RunResult:
    """One run: fresh fleet, contender in front, the seed's schedule played open-loop;
    ``fleet_cpus`` / ``client_cpus``: CPU budgets of the simulator and the client (0: none)."""
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
                  cpus=fleet_cpus, profile=profile) as fleet, \
            contender.running(fleet, workdir) as url:
        cmd = [sys.executable, "-m", "bench.openloop", "--url", url,
               "--requests", str(workdir / "requests.jsonl"),
               "--out", str(workdir / "outcomes.jsonl"), "--timeout", str(timeout)]
        if progress:
            cmd.append("--progress")
        with contextlib.ExitStack() as stack:
            client = subprocess.Popen(cmd)
            stack.callback(client.kill)   # only if this block fails before it ends
            if client_cpus:
                stack.enter_context(cpubudget.CpuBudget(client_cpus)).add(client.pid)
            if client.wait() != 0:
                raise subprocess.CalledProcessError(client.returncode, cmd)
        debug = contender.debug()
        if debug:
            (workdir / "debug.json").write_text(json.dumps(debug, indent=1))
    res.wall_seconds = time.monotonic() - started
    res.router_cpu, res.router_throttled = contender.cpu_used, contender.throttled
    outcomes = [Outcome(**dict(orjson.loads(line).items()))
                for line in (workdir / "outcomes.jsonl").read_bytes().splitlines()]
    return summarize(res, outcomes, time_scale,
                     tags=[s.tag for s in specs] if workload.by_class else None)


def _peer_status() -> list[str]:
    from bench.peers import PEERS

    out = []
    for peer in PEERS.values():
        if peer.installed():
            out.append(f"{peer.package} {peer.version()}")
        else:
            out.append(f"{peer.package} NOT INSTALLED (`python -m bench.peers install`)")
    return out


def report(results: list[RunResult], meta: dict[str, object]) -> str:
    """The "## Routing comparison" section of RESULTS.md."""
    seeds = sorted({r.seed for r in results})
    servers = sorted({r.servers for r in results})
    n = servers[0] if len(servers) == 1 else max(servers or [0])
    lines = [
        SECTION, "",
        f"Command: `{meta['command']}` (took {float(meta['wall']) / 60:.1f} min; "  # type: ignore[arg-type]
        f"{meta.get('note', '')}). Seeds {seeds}; fleet: {n} x `vllm-sim` `{PROFILE}` "
        f"(unchanged profile, time scale {meta['time_scale']}, fresh fleet per run). "
        "The machine has 2 CPUs shared by the client, Envoy, the router, the simulator - and "
        "other engineers' jobs, so wall-clock drift is part of the noise the intervals carry. "
        f"CPU budgets: {meta.get('budget') or 'none (whole machine)'}; background CPU "
        f"burners: {meta.get('burners', 0)}; load average at the end "
        f"{meta.get('loadavg', '?')}. "
        "Times are model seconds; \"load\" is offered rate / the workload's nominal fleet "
        "capacity. Each run leaves out its first 20% of requests (cold start, reported as "
        "\"cold TTFT p90\"). Figures are medians over seeds; ratios are paired by seed, "
        "\"median [95% bootstrap interval]\"; a target is **met** only when the whole interval "
        "is on its side. How to read this: `docs/benchmarks.md`.",
        "",
        "Peers (PyPI wheels in their own venvs under `.cache/peers/`, default thresholds): "
        + "; ".join(_peer_status()) + ".",
        "",
    ]
    tl = rp.target_lines(results)
    if tl:
        lines += ["### Targets", "", *tl, ""]
    lines += rp.point_sections(results, WORKLOADS, list(all_contenders()))
    pngs = sorted(p.name for p in rp.PLOTS.glob("compare_*.png"))
    lines += [f"![{p}](plots/{p})" for p in pngs]
    return "\n".join(lines).rstrip() + "\n"


def _save(run_dir: Path, meta: dict[str, object], results: list[RunResult]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(
        json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1))


def load_run(run_dir: Path) -> tuple[dict[str, object], list[RunResult]]:
    """A saved run's meta and results."""
    saved = json.loads((run_dir / "results.json").read_text())
    return saved["meta"], [RunResult(**r) for r in saved["results"]]


def publish(results: list[RunResult], meta: dict[str, object]) -> str:
    """Plots + the RESULTS.md section; returns the section."""
    rp.plot(results, "compare", str(meta["command"]), list(all_contenders()))
    section = report(results, meta)
    rp.write_section(SECTION, section)
    return section


# -- main ----------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="CI smoke: shared-prefix at load 0.3 for 4 model s (time scale 0.25), "
                        "1 seed, 4 servers, every contender; checks only that each completed")
    p.add_argument("--workloads", default=",".join(FULL_WORKLOADS), help="comma-separated")
    p.add_argument("--loads", default=f"{FULL_LOAD:g}",
                   help="offered loads (fractions of capacity), comma-separated; "
                        "'workload' = each workload file's own list")
    p.add_argument("--contenders", default=",".join(FULL_RUN),
                   help="comma-separated; 'all' = every contender")
    p.add_argument("--seeds", type=_positive_int, default=5,
                   help="how many seeds, from --first-seed on; every contender runs every "
                        "seed (default 5)")
    p.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    cpubudget.add_arguments(p)
    p.add_argument("--servers", type=_positive_int, default=8,
                   help="simulated servers in the fleet (default 8)")
    p.add_argument("--duration", type=float, default=0.0,
                   help="arrival window per run, model seconds (default: the workload's)")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale")
    p.add_argument("--timeout", type=float, default=90.0, help="per-request limit (wall s)")
    p.add_argument("--note", default="", help="free text for the RESULTS.md header")
    p.add_argument("--no-write", action="store_true",
                   help="do not touch RESULTS.md / plots")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--report-only", type=Path, default=None, metavar="RUN_DIR",
                   help="rebuild tables, plots and RESULTS.md from RUN_DIR/results.json")
    args = p.parse_args(argv)
    if args.quick:
        # 4x faster simulated time: the runs are startup-bound, the numbers don't matter.
        args.workloads, args.loads, args.duration, args.seeds = "shared-prefix", "0.3", 4.0, 1
        args.time_scale, args.no_write, args.timeout, args.servers = 0.25, True, 30.0, 4
        args.contenders = "all"
    names = list(all_contenders()) if args.contenders == "all" else args.contenders.split(",")
    for name in names:
        if name not in all_contenders():
            p.error(f"--contenders: unknown contender {name!r} "
                    f"(known: {', '.join(all_contenders())})")
    args.contender_names = names
    for wl in args.workloads.split(","):
        if wl not in WORKLOADS:
            p.error(f"--workloads: unknown workload {wl!r} (known: {', '.join(WORKLOADS)})")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; exit status 1 when a run failed (quick: any contender)."""
    args = parse_args(argv)
    if args.report_only:
        saved_meta, loaded = load_run(args.report_only)
        print(publish(loaded, saved_meta))
        return 0
    command = "python -m bench.compare " + " ".join(sys.argv[1:] if argv is None else argv)
    contenders = {k: all_contenders()[k] for k in args.contender_names}
    for c in contenders.values():
        c.cpus, c.gateway_cpus = args.router_cpus, args.gateway_cpus
    run_dir = RUNS / time.strftime("%Y%m%d-%H%M%S")
    started = time.monotonic()
    meta: dict[str, object] = {"command": command.strip(), "seeds": args.seeds,
                               "servers": args.servers, "time_scale": args.time_scale,
                               "wall": 0.0, "note": args.note, "burners": args.burners,
                               "budget": cpubudget.statement(args),
                               "durations": {w: args.duration or WORKLOADS[w].duration
                                             for w in args.workloads.split(",")}}
    with cpubudget.burners(args.burners):
        results = run_all(args, contenders, run_dir, meta, started)
    wall = time.monotonic() - started
    meta["wall"] = wall
    meta["loadavg"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    _save(run_dir, meta, results)
    section = publish(results, meta) if not args.no_write else report(results, meta)
    print(section)
    print(f"raw outcomes: {run_dir}  ({wall:.0f} s)", file=sys.stderr)
    failed = [r for r in results
              if (r.skipped.startswith("failed") or (not r.skipped and r.ok == 0))]
    if args.quick:
        failed += [r for r in results if not r.skipped and r.errors]
    for r in failed:
        print(f"FAILED: {r.workload} {r.load:g} seed {r.seed} {r.contender}: "
              f"{r.skipped or r.error_samples}", file=sys.stderr)
    skipped = sorted({r.contender for r in results if r.skipped and r not in failed})
    if skipped:
        print(f"WARNING: NOT RUN here: {', '.join(skipped)} (see the SKIPPED lines)",
              file=sys.stderr)
    return 1 if failed else 0


def run_all(args: argparse.Namespace, contenders: dict[str, Contender], run_dir: Path,
            meta: dict[str, object], started: float) -> list[RunResult]:
    """Every workload x load x seed x contender, the contenders' order alternating."""
    results: list[RunResult] = []
    flip = False
    for wl_name in args.workloads.split(","):
        wl = WORKLOADS[wl_name]
        loads = (list(wl.loads) if args.loads == "workload"
                 else [float(x) for x in args.loads.split(",")])
        for load in loads:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                order = list(contenders.values())
                if flip:
                    order.reverse()
                flip = not flip
                for c in order:
                    workdir = (run_dir / wl.name / f"{load:g}" / f"seed-{seed}"
                               / c.name.replace(":", "-"))
                    try:
                        res = run_one(wl, load, c, duration=args.duration or wl.duration,
                                      seed=seed, servers=args.servers,
                                      time_scale=args.time_scale, workdir=workdir,
                                      progress=not args.no_progress, timeout=args.timeout,
                                      fleet_cpus=args.fleet_cpus,
                                      client_cpus=args.client_cpus)
                    except Exception as exc:  # a contender that fails to start is a result
                        res = RunResult(wl.name, load, load * wl.capacity(args.servers),
                                        c.name, c.kind, seed=seed, servers=args.servers,
                                        skipped=f"failed: {type(exc).__name__}: {exc}"[:300])
                    results.append(res)
                    meta["wall"] = time.monotonic() - started
                    _save(run_dir, meta, results)
                    print(f"{wl.name:13s} load {load:<4g} seed {seed} {c.name:26s} "
                          + (f"SKIPPED {res.skipped}" if res.skipped else
                             f"ok {res.ok}/{res.requests} TTFT p50 {res.ttft_p50:.3f} "
                             f"p90 {res.ttft_p90:.3f} s (cold p90 {res.cold_ttft_p90:.3f})  "
                             f"{res.output_tps:.0f} tok/s  hit {100 * res.cache_hit:.0f}%  "
                             f"({res.wall_seconds:.0f} s"
                             + (f", router CPU {res.router_cpu:.1f} s, throttled "
                                f"{res.router_throttled:.1f} s" if res.router_cpu else "")
                             + ")"),
                          file=sys.stderr, flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
