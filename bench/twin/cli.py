"""``python -m bench.twin``: the routing matrix in virtual time (see :mod:`bench.twin`).

Every (workload, load, servers, seed) plays the workload's schedule for that seed - the same
schedule ``bench.compare`` sends for the same seed and fleet size - through every router.
Router names match ``bench.compare``'s contenders (``envoy-rr`` is the twin's round-robin),
so the same tables, ratios, intervals and verdicts apply.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

from rich.progress import track

from bench import report as rp
from bench.contenders import TUNED_CONFIG
from bench.report import RunResult, summarize
from bench.twin.baselines import LeastRequest, Random, RoundRobin
from bench.twin.cpu import ProcessCpu
from bench.twin.epp_adapter import ConfigError, EppRouter
from bench.twin.loop import Router, TwinConfig, run
from bench.workloads import MODEL, WORKLOADS

SECTION = "## Virtual-time twin"
RUNS = Path(__file__).resolve().parents[2] / ".cache" / "bench-twin"
ROUTERS = ("envoy-rr", "envoy-random", "envoy-lr", "epp-default", "epp-tuned")
#: Model seconds per run when --duration is not given (the real-time run's window).
DURATION_FACTOR = 1.0

RouterFactory = Callable[[list[str], int], Router]
#: The EPP's CPU costs the twin's ``--epp-cpus`` uses (``bench.epp_cpu --save``).
MEASURED_COST = Path(__file__).with_name("epp_cost.json")


def router_factories(config: Path | None,
                     cpu: ProcessCpu | None = None) -> dict[str, RouterFactory]:
    """Every router the twin knows; ``--config FILE`` adds ``epp:<file stem>``. ``cpu``: each
    EPP run gets its own process CPU model like it (None: the EPP's CPU is free)."""
    def own() -> ProcessCpu | None:
        return dataclasses.replace(cpu) if cpu is not None else None

    out: dict[str, RouterFactory] = {
        "envoy-rr": lambda keys, seed: RoundRobin("envoy-rr", keys, seed),
        "envoy-random": lambda keys, seed: Random("envoy-random", keys, seed),
        "envoy-lr": lambda keys, seed: LeastRequest("envoy-lr", keys, seed),
        "epp-default": lambda keys, seed: EppRouter("epp-default", keys, seed, model=MODEL,
                                                    cpu=own()),
        "epp-tuned": lambda keys, seed: EppRouter("epp-tuned", keys, seed, cpu=own(),
                                                  config_text=TUNED_CONFIG, model=MODEL),
    }
    if config is not None:
        name = f"epp:{config.stem}"
        out[name] = lambda keys, seed: EppRouter(name, keys, seed, config_file=config,
                                                 model=MODEL, cpu=own())
    return out


def kind(name: str) -> str:
    return "ours" if name.startswith("epp") else "baseline"


Job = tuple[str, float, int, int, tuple[str, ...], float, str | None, ProcessCpu | None]


def run_job(job: Job) -> list[RunResult]:
    """One (workload, load, servers, seed): the schedule, built once, through each router."""
    wl_name, load, servers, seed, routers, duration, config, cpu = job
    wl = WORKLOADS[wl_name]
    specs = wl.schedule(load, duration, seed, servers)
    cfg = TwinConfig(servers=servers, seed=seed, model=MODEL)
    factories = router_factories(Path(config) if config else None, cpu)
    out = []
    for name in routers:
        started = time.monotonic()
        outcomes = run(specs, factories[name](cfg.keys(), seed), cfg)
        res = RunResult(wl_name, load, load * wl.capacity(servers), name, kind(name),
                        seed=seed, servers=servers)
        summarize(res, outcomes, tags=[s.tag for s in specs] if wl.by_class else None)
        res.wall_seconds = time.monotonic() - started
        out.append(res)
    return out


def run_one(workload: str, load: float, servers: int, seed: int, router: str,
            duration: float, config: str | None = None,
            cpu: ProcessCpu | None = None) -> RunResult:
    """A single router's run."""
    return run_job((workload, load, servers, seed, (router,), duration, config, cpu))[0]


def _floats(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers, got {text!r}") from None
    if min(out) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return out


def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers, got {text!r}") from None
    if min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.twin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", "--workloads", dest="workloads",
                   default="shared-prefix,lora,bursts,sharegpt", help="comma-separated")
    p.add_argument("--load", "--loads", dest="loads", type=_floats, default=[0.75],
                   help="offered loads, fractions of nominal capacity (default 0.75)")
    p.add_argument("--servers", type=_ints, default=[8, 32], help="fleet sizes (default 8,32)")
    p.add_argument("--seeds", type=_ints, default=[10], help="seeds 0..N-1 (default 10)")
    p.add_argument("--routers", default=",".join(ROUTERS),
                   help=f"comma-separated (default {','.join(ROUTERS)}; with --config, "
                        "epp:<stem> is added)")
    p.add_argument("--config", type=Path, default=None,
                   help="an EndpointPickerConfig file to try as the router epp:<stem>")
    p.add_argument("--duration", type=float, default=0.0,
                   help=f"arrival window per run, model seconds (default {DURATION_FACTOR:g}x "
                        "the workload's real-time window)")
    p.add_argument("--epp-cpus", type=float, default=0.0,
                   help="model the EPP process's CPU at this budget (e.g. 1; at most 1 is "
                        "used: one interpreter), with the costs in --epp-cost; 0: free CPU")
    p.add_argument("--epp-cost", type=Path, default=MEASURED_COST,
                   help="the EPP's measured CPU costs (bench.epp_cpu --save; default "
                        "bench/twin/epp_cost.json)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md / plots")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke: shared-prefix, 8 servers, 2 seeds, 10 model s")
    args = p.parse_args(argv)
    args.seeds = args.seeds[0]
    if args.epp_cpus < 0:
        p.error(f"--epp-cpus: expected a CPU budget >= 0, got {args.epp_cpus:g}")
    if args.epp_cpus:
        try:
            for servers in args.servers:
                ProcessCpu.measured(args.epp_cost, args.epp_cpus, servers)
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--epp-cost: cannot use the EPP's costs in {args.epp_cost}: {e!r}")
    if args.quick:
        args.workloads, args.servers, args.seeds, args.duration = "shared-prefix", [8], 2, 10.0
        args.no_write = True
    for wl in args.workloads.split(","):
        if wl not in WORKLOADS:
            p.error(f"--workload: unknown workload {wl!r} (known: {', '.join(WORKLOADS)})")
    if args.config is not None:
        try:
            EppRouter("check", ["127.0.0.1:8000"], 0, config_file=args.config)
        except ConfigError as e:
            p.error(f"--config: {e}")
    known = router_factories(args.config)
    names = args.routers.split(",")
    if args.config is not None:
        names.append(f"epp:{args.config.stem}")
    for name in names:
        if name not in known:
            p.error(f"--routers: unknown router {name!r} (known: {', '.join(known)})")
    args.router_names = list(dict.fromkeys(names))
    return args


def report(results: list[RunResult], meta: dict[str, object]) -> str:
    """The "## Virtual-time twin" section."""
    lines = [
        SECTION, "",
        f"Command: `{meta['command']}` (took {float(meta['wall']):.0f} s wall with "  # type: ignore[arg-type]
        f"{meta['jobs']} worker processes on this shared 2-CPU machine). Model seconds; "
        "each run leaves out its first 20% of requests (cold start, shown apart); medians "
        "over seeds, ratios paired by seed with 95% bootstrap intervals. `envoy-*` are the "
        "twin's round-robin / random / least-request (power of two choices); `epp-*` are "
        "the real EPP scheduler and director (`bench/twin/epp_adapter.py`). What the twin "
        "models and leaves out: `docs/benchmarks.md`.", "",
    ]
    if meta.get("epp_cpu"):
        lines[-1:-1] = [f" The EPP's CPU is modelled: {meta['epp_cpu']}."]
    for servers in sorted({r.servers for r in results}):
        subset = [r for r in results if r.servers == servers]
        lines += [f"### {servers} servers", ""]
        # Peers are not reimplemented in the twin: only the targets against round-robin.
        tl = rp.target_lines(subset, [t for t in rp.TARGETS if t.against != "best-peer"])
        if tl:
            lines += ["Targets (twin):", "", *tl, ""]
        lines += [ln.replace("### ", "#### ", 1) if ln.startswith("### ") else
                  ln.replace("#### ", "##### ", 1) if ln.startswith("#### ") else ln
                  for ln in rp.point_sections(subset, WORKLOADS, list(ROUTERS))]
    pngs = sorted(p.name for p in rp.PLOTS.glob("twin_*.png"))
    lines += [f"![{p}](plots/{p})" for p in pngs]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m bench.twin " + " ".join(sys.argv[1:] if argv is None else argv)
    cfg = str(args.config) if args.config else None
    def cpu(servers: int) -> ProcessCpu | None:
        return (ProcessCpu.measured(args.epp_cost, args.epp_cpus, servers)
                if args.epp_cpus else None)

    jobs: list[Job] = [
        (wl, load, servers, seed, tuple(args.router_names),
         args.duration or DURATION_FACTOR * WORKLOADS[wl].duration, cfg, cpu(servers))
        for wl in args.workloads.split(",") for load in args.loads for servers in args.servers
        for seed in range(args.seeds)]
    started = time.monotonic()
    results: list[RunResult] = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for batch in track(pool.map(run_job, jobs), total=len(jobs), description="twin runs",
                           disable=not sys.stderr.isatty()):
            results.extend(batch)
    wall = time.monotonic() - started
    meta: dict[str, object] = {"command": command.strip(), "wall": wall, "jobs": args.jobs}
    c = cpu(1)
    if c is not None:
        meta["epp_cpu"] = (f"{c.cpus:g} CPU, {c.per_request * 1e3:.2f} ms per request, "
                           f"{c.per_token * 1e6:.0f} µs per streamed token, {c.idle:.2%} of "
                           f"a CPU per scraped pod (from {args.epp_cost.name})")
    run_dir = RUNS / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(
        json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1))
    if not args.no_write:
        for servers in sorted(set(args.servers)):
            rp.plot([r for r in results if r.servers == servers], f"twin_{servers}",
                    f"{command} ({servers} servers)", list(ROUTERS))
    section = report(results, meta)
    if not args.no_write:
        rp.write_section(SECTION, section)
    print(section)
    print(f"{len(results)} runs in {wall:.1f} s; raw: {run_dir}", file=sys.stderr)
    failed = [r for r in results if not r.usable]
    for r in failed:
        print(f"FAILED: {r.workload} {r.load:g} {r.servers} seed {r.seed} {r.contender}",
              file=sys.stderr)
    return 1 if failed else 0
