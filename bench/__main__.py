"""The benchmark toolkit: scenarios as data, one runner, RESULTS.md generated.

    python -m bench list                                   # the scenarios and what they hold
    python -m bench run bench/scenarios/pd.yaml            # virtual time (the twin), seconds
    python -m bench run bench/scenarios/pd.yaml --real     # through Envoy, real processes
    python -m bench run pd --servers 32 --workload my-workload.yaml --seeds 3
    python -m bench run shared-prefix --real --save        # and keep it for RESULTS.md
    python -m bench report [--check]                       # RESULTS.md sections from bench/runs/
    python -m bench advise pd-split                        # which P:D split for a workload+SLO

A scenario is a file of ``bench/scenarios/`` (or any path); its schema is in
:mod:`bench.scenario`, the runner in :mod:`bench.runner`, and docs/benchmarks.md explains the
toolkit in one page.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import report as rp
from bench import runner
from bench.scenario import SCENARIOS, ScenarioError, load_scenario, scenario_files
from bench.twin.cpu import MEASURED_COST
from bench.workloads import Workload, WorkloadError, find_workload

ROOT = Path(__file__).resolve().parent
#: Saved runs that RESULTS.md's generated sections come from (committed).
SAVED = ROOT / "runs"


def _scenario_path(text: str) -> Path:
    path = Path(text)
    if path.is_file():
        return path
    named = SCENARIOS / f"{text}.yaml"
    if named.is_file():
        return named
    raise argparse.ArgumentTypeError(
        f"no scenario {text!r} (a file, or one of: "
        f"{', '.join(p.stem for p in scenario_files())})")


def _parsed(what: str, convert: Callable[[str], Any],
            ok: Callable[[Any], bool]) -> Callable[[str], Any]:
    """An argparse type: ``convert(text)`` where ``ok`` of it, else "expected ``what``"."""
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


_positive = _parsed("a positive integer", int, lambda n: n >= 1)
_floats = _parsed("positive numbers", lambda t: [float(x) for x in t.split(",")],
                  lambda xs: min(xs) > 0)
#: a count (from the scenario's first seed) or a list of seeds
_seeds = _parsed("a count (3) or a list of seeds (0,1,101)",
                 lambda t: [int(x) for x in t.split(",")] if "," in t else int(t),
                 lambda s: min(s) >= 0 if isinstance(s, list) else s >= 1)
_share = _parsed("a share in (0, 1]", float, lambda a: 0 < a <= 1)
#: the advisor's fleets: P (prefill servers) or E/P (encode, prefill), with the aggregated (0, 0)
_splits = _parsed("P or E/P integers", lambda t: sorted({(0, 0), *(
    (int(x.split("/")[0]), int(x.split("/")[1])) if "/" in x else (0, int(x))
    for x in t.split(","))}), lambda splits: min(min(split) for split in splits) >= 0)


def _workload(text: str) -> Workload:
    try:
        return find_workload(text, Path.cwd())
    except WorkloadError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    # what run and advise both take: a scenario and what of it to change
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("scenario", type=_scenario_path,
                        help="a scenario file, or the name of one in bench/scenarios/")
    common.add_argument("--seeds", type=_seeds,
                        help="a count (from the scenario's first seed) or a list: 0,1,101")
    common.add_argument("--servers", type=_positive,
                        help="fleet size (a P/D fleet keeps its prefill share)")
    common.add_argument("--workload", type=_workload,
                        help="a workload of bench/workloads/ or a workload file, instead of "
                             "the scenario's (its own loads then, unless --loads)")
    common.add_argument("--loads", type=_floats, help="offered loads, comma-separated")
    common.add_argument("--duration", type=float, help="arrival window per run, model seconds")
    common.add_argument("--profile",
                        help="simulator profile of every server instead of the scenario's "
                             "(sim/profiles.py; saved runs and their RESULTS.md headings "
                             "name it)")
    common.add_argument("--jobs", type=_positive, default=os.cpu_count() or 1,
                        help="worker processes in virtual time (default: the CPUs)")
    run = sub.add_parser("run", parents=[common], help="play a scenario")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--virtual", "--twin", dest="mode", action="store_const",
                      const="virtual", help="virtual time, the twin (default)")
    mode.add_argument("--real", dest="mode", action="store_const", const="real",
                      help="real time: real processes through Envoy")
    run.add_argument("--time-scale", type=float,
                     help="real time: run the simulator N x slower than the model")
    run.add_argument("--contenders", help="only these of the scenario's, comma-separated")
    run.add_argument("--router-cpus", type=float,
                     help="the router process's CPU budget (the scenario's budget.router_cpus);"
                          " in virtual time the EPP's CPU is modelled at it from --epp-cost")
    run.add_argument("--epp-cost", type=Path, default=MEASURED_COST,
                     help="the EPP's measured CPU costs (bench.epp_cpu --save; default "
                          "bench/twin/epp_cost.json)")
    run.add_argument("--save", action="store_true",
                     help="keep the results as bench/runs/<scenario>-<mode>-<servers>.json, where "
                          "`bench report` makes RESULTS.md sections from")
    adv = sub.add_parser("advise", parents=[common],
                         help="which prefill:decode split meets an SLO at the highest rate (a "
                              "sweep in virtual time of the scenario's workload, fleet, seeds, "
                              "loads and first pd contender's P/D variant)")
    adv.add_argument("--tpot-ms", type=_floats, default=[20.0, 30.0],
                     help="TPOT bounds of the SLO, ms (default 20,30); the first decides")
    adv.add_argument("--ttft-floor", type=float, default=0.5,
                     help="TTFT bound floor, s (TTFT <= max(FLOOR, FACTOR x isolated prefill))")
    adv.add_argument("--ttft-factor", type=float, default=2.0)
    adv.add_argument("--attainment", type=_share, default=0.9,
                     help="share of requests that must meet the SLO")
    adv.add_argument("--splits", type=_splits,
                     help="fleets to try, comma-separated: P (prefill servers; 0: the "
                          "aggregated fleet, always added) or E/P (E encode servers, P "
                          "prefill; E/0 is E/PD); default all")
    sub.add_parser("list", help="the scenarios of bench/scenarios/")
    rep = sub.add_parser("report", help="rewrite RESULTS.md's generated sections")
    rep.add_argument("--check", action="store_true",
                     help="change nothing; fail when a saved run's scenario changed since "
                          "the run, or a generated section differs from its run")
    rep.add_argument("--results", type=Path, default=rp.RESULTS, help=argparse.SUPPRESS)
    rep.add_argument("--runs", type=Path, default=SAVED, help=argparse.SUPPRESS)
    return p


def _plan(args: argparse.Namespace, **more: Any) -> runner.Plan:
    """The scenario with what ``run`` and ``advise`` both take (``--seeds``: a count from
    the scenario's first seed, or the list given) and ``more`` of ``run``'s."""
    scn = load_scenario(args.scenario)
    seeds = (list(range(scn.seeds[0], scn.seeds[0] + args.seeds))
             if isinstance(args.seeds, int) else args.seeds)
    return runner.plan(scn, seeds=seeds, servers=args.servers, workload=args.workload,
                       loads=args.loads, duration=args.duration, jobs=args.jobs,
                       profile=args.profile, **more)


def cmd_run(args: argparse.Namespace) -> int:
    # a negative number is not a flag's value to argparse ("-1": an option): checked here
    if args.router_cpus is not None and args.router_cpus < 0:
        raise ValueError(f"--router-cpus: expected a CPU budget >= 0, got {args.router_cpus:g}")
    mode = args.mode or "virtual"
    p = _plan(args, mode=mode, router_cpus=args.router_cpus, epp_cost=args.epp_cost,
              contenders=args.contenders.split(",") if args.contenders else None,
              time_scale=args.time_scale)
    scn = p.scenario
    run_dir = runner.run_dir_for(scn, mode)
    doc = runner.execute(p, run_dir)
    print((run_dir / "results.md").read_text())
    print(f"results: {run_dir / 'results.json'}", file=sys.stderr)
    if args.save:
        SAVED.mkdir(exist_ok=True)
        other = f"-{p.fleet.profile}" if p.fleet.profile != scn.fleet.profile else ""
        dest = SAVED / f"{scn.name}-{mode}-{p.fleet.servers}{other}.json"
        shutil.copyfile(run_dir / "results.json", dest)
        print(f"saved: {dest} (python -m bench report puts it in RESULTS.md)", file=sys.stderr)
    failed = [r for r in doc["results"]
              if r["skipped"].startswith("failed") or (not r["skipped"] and r["ok"] == 0)]
    for r in failed:
        print(f"FAILED: load {r['load']:g} seed {r['seed']} {r['contender']}: "
              f"{r['skipped'] or r['error_samples']}", file=sys.stderr)
    return 1 if failed else 0


def cmd_advise(args: argparse.Namespace) -> int:
    """The split advisor's sweep and table (bench.twin.advisor)."""
    from bench.scenario import PdVariant
    from bench.twin import advisor

    p = _plan(args)
    scn, seeds, servers, wl = p.scenario, list(p.seeds), p.fleet.servers, p.workload
    profile, loads, duration = p.fleet.profile, sorted(p.loads), p.duration
    variant = next((c.pd for c in scn.contenders if c.pd is not None),
                   PdVariant(threshold=1024, prefill_pick="tokens"))
    slos = [advisor.Slo(tpot=t / 1000.0, ttft_floor=args.ttft_floor,
                        ttft_factor=args.ttft_factor, attainment=args.attainment)
            for t in args.tpot_ms]
    rate_of = {load: load * wl.capacity(servers) for load in loads}
    if args.splits and not all(e + p < servers for e, p in args.splits):
        raise ValueError(f"--splits: each needs E + P in 0..{servers - 1}, got {args.splits}")
    cells = advisor.sweep(wl, profile, servers, loads, seeds, duration, variant, slos,
                          splits=args.splits, jobs=args.jobs)
    rows, advised = advisor.summarize(cells, servers, slos, rate_of)
    print(f"Split advisor: workload `{wl.name}` on {servers} x `{profile}`, P/D variant "
          f"nonCachedTokens {variant.threshold}, prefill pick {variant.prefill_pick}, decode "
          f"pick {variant.decode_pick}{', spill ' + variant.spill if variant.spill else ''}; "
          f"SLO {slos[0].describe()} (also at "
          f"{', '.join(f'{s.tpot * 1e3:g}' for s in slos[1:]) or '-'} ms); {len(seeds)} "
          f"seeds x {duration:g} model s; rates swept (req/s): "
          f"{', '.join(f'{r:.2f}' for r in rate_of.values())}. Goodput: median over seeds; "
          "ratio: median of the per-seed ratios [95% CI of the geometric mean].\n")
    print(advisor.table(rows, advised, servers, slos))
    print(f"\nadvice: {next(r for r in rows if r.fleet == advised).name(servers)}")
    return 0


def cmd_list() -> int:
    for path in scenario_files():
        scn = load_scenario(path)
        f = scn.fleet
        fleet = (f"{f.roles['prefill']}P+{f.roles['decode']}D" if f.pd else f"{f.servers}")
        print(f"{scn.name:22s} {scn.title}\n{'':22s} fleet {fleet}, workload "
              f"{scn.workload.name}, loads {list(scn.loads)}, {len(scn.seeds)} seeds; "
              f"contenders {', '.join(c.name for c in scn.contenders)}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Each saved run's section, regenerated (or checked)."""
    problems = []
    text = args.results.read_text() if args.results.exists() else ""
    for saved in sorted(args.runs.glob("*.json")):
        doc = json.loads(saved.read_text())
        scenario = runner.ROOT / doc["scenario"]
        try:
            scn = load_scenario(scenario)
        except ScenarioError as e:
            problems.append(f"{saved.name}: {e}")
            continue
        if scn.digest != doc["digest"]:
            problems.append(f"{saved.name}: {doc['scenario']} changed since this run "
                            f"(digest {doc['digest']}, now {scn.digest}): run it again")
        # Runs saved before 2026-11-29 recorded the scenario file's digest only.
        if doc.get("inputs_digest") not in (None, scn.inputs_digest):
            names = ", ".join([p.name for p in scn.inputs] + (
                ["the built-in default profile"] if scn.runs_default_profile else []))
            problems.append(f"{saved.name}: an EPP config of {doc['scenario']} ({names}) "
                            "changed since this run: run it again")
        source = str(saved.relative_to(runner.ROOT)) if saved.is_relative_to(
            runner.ROOT) else str(saved)
        section = runner.section(doc, source)
        if args.check:
            if section.rstrip() not in text:
                problems.append(f"{saved.name}: its RESULTS.md section differs from the run "
                                "(python -m bench report rewrites it)")
        else:
            rp.write_section(runner.heading(doc), section, args.results)
            text = args.results.read_text()
            print(f"{args.results.name}: regenerated \"{runner.heading(doc)}\" from {source}")
    for line in problems:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "advise":
            return cmd_advise(args)
        if args.command == "list":
            return cmd_list()
        return cmd_report(args)
    except (ScenarioError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
