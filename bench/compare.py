"""Routing comparison: every contender in front of the same simulated fleet, same requests.

    python -m bench.compare                    # full run (~25 min): tables, plots, RESULTS.md
    python -m bench.compare --quick            # CI smoke: one short rate per contender, < 60 s
    python -m bench.compare --workloads shared-prefix --loads 0.75 --contenders envoy-rr,epp-tuned

For each workload and offered load, each contender gets one run: a fresh ``vllm-sim`` fleet
(cold caches), the contender started in front of it, and the open-loop client
(``bench.openloop``, its own process) playing the workload's seeded schedule. The order of the
contenders alternates between load points so slow drift of the shared machine does not always
hit the same one. Outcomes are summarised (TTFT p50/p90/p99, e2e p90, output tok/s, errors,
prefix-cache hit rate from ``usage.prompt_tokens_details.cached_tokens``) and compared with
Envoy round-robin and with the best peer of the same run.

Raw per-request outcomes and logs stay under ``.cache/bench-compare/<timestamp>/``; the full run
writes ``bench/plots/compare_*.png`` and the "## Routing comparison" section of
``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from bench.contenders import Contender, SimFleet, all_contenders
from bench.openloop import Outcome
from bench.workloads import FLEET_SIZE, PROFILE, WORKLOADS, Workload, write_specs

ROOT = Path(__file__).resolve().parent
PLOTS = ROOT / "plots"
RESULTS = ROOT / "RESULTS.md"
RUNS = ROOT.parent / ".cache" / "bench-compare"
SECTION = "## Routing comparison"
BASELINE = "envoy-rr"


@dataclass
class RunResult:
    """One (workload, load, contender) run, summarised. Times are model seconds."""

    workload: str
    load: float
    offered_rps: float
    contender: str
    kind: str
    requests: int = 0
    ok: int = 0
    errors: int = 0
    ttft_p50: float = 0.0
    ttft_p90: float = 0.0
    ttft_p99: float = 0.0
    e2e_p90: float = 0.0
    tpot_p50: float = 0.0
    itl_p90: float = 0.0
    output_tps: float = 0.0
    achieved_rps: float = 0.0
    cache_hit: float = 0.0
    wall_seconds: float = 0.0
    pods: dict[str, int] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    skipped: str = ""

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1), linear interpolation; 0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(res: RunResult, outcomes: list[Outcome], time_scale: float) -> RunResult:
    """Fill ``res`` from per-request outcomes (wall seconds -> model seconds)."""
    ok = [o for o in outcomes if o.ok]
    res.requests, res.ok = len(outcomes), len(ok)
    res.errors = res.requests - res.ok
    res.error_samples = sorted({o.error or f"HTTP {o.status}" for o in outcomes if not o.ok})[:3]
    ttft = [o.ttft / time_scale for o in ok if o.ttft is not None]
    e2e = [o.e2e / time_scale for o in ok if o.e2e is not None]
    res.ttft_p50, res.ttft_p90, res.ttft_p99 = pct(ttft, .5), pct(ttft, .9), pct(ttft, .99)
    res.e2e_p90 = pct(e2e, .9)
    res.tpot_p50 = pct([t / time_scale for o in ok if (t := o.tpot) is not None], .5)
    res.itl_p90 = pct([g / time_scale for o in ok for g in o.itl], .9)
    if ok:
        first = min(o.start for o in outcomes)
        last = max(o.start + (o.e2e or 0.0) for o in ok)
        span = max(1e-9, (last - first) / time_scale)
        res.output_tps = sum(o.output_tokens for o in ok) / span
        res.achieved_rps = len(ok) / span
        prompt = sum(o.prompt_tokens for o in ok)
        res.cache_hit = sum(o.cached_tokens for o in ok) / prompt if prompt else 0.0
    pods: dict[str, int] = {}
    for o in ok:
        pods[o.pod] = pods.get(o.pod, 0) + 1
    res.pods = dict(sorted(pods.items()))
    return res


def run_one(workload: Workload, load: float, contender: Contender, *, duration: float,
            seed: int, time_scale: float, workdir: Path, progress: bool,
            timeout: float) -> RunResult:
    """One run: fresh fleet, contender in front, the schedule played open-loop."""
    specs = workload.schedule(load, duration, seed)
    res = RunResult(workload.name, load, load * workload.capacity, contender.name,
                    contender.kind)
    reason = contender.unavailable()
    if reason:
        res.skipped = reason
        return res
    workdir.mkdir(parents=True, exist_ok=True)
    # The schedule is in model seconds; the simulator runs time_scale x slower than a GPU.
    specs = [dataclasses.replace(s, at=s.at * time_scale) for s in specs]
    write_specs(specs, workdir / "requests.jsonl")
    started = time.monotonic()
    with SimFleet(workdir / "fleet", time_scale=time_scale, seed=seed) as fleet, \
            contender.running(fleet, workdir) as url:
        cmd = [sys.executable, "-m", "bench.openloop", "--url", url,
               "--requests", str(workdir / "requests.jsonl"),
               "--out", str(workdir / "outcomes.jsonl"), "--timeout", str(timeout)]
        if progress:
            cmd.append("--progress")
        subprocess.run(cmd, check=True)
        debug = contender.debug()
        if debug:
            (workdir / "debug.json").write_text(json.dumps(debug, indent=1))
    res.wall_seconds = time.monotonic() - started
    outcomes = [Outcome(**{k: v for k, v in orjson.loads(line).items()})
                for line in (workdir / "outcomes.jsonl").read_bytes().splitlines()]
    return summarize(res, outcomes, time_scale)


# -- report --------------------------------------------------------------------------------------
def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "n/a"


def best_peer(rows: list[RunResult]) -> RunResult | None:
    """The peer with the lowest TTFT p90 among those that completed."""
    peers = [r for r in rows if r.kind == "peer" and not r.skipped and r.ok]
    return min(peers, key=lambda r: r.ttft_p90) if peers else None


def table(rows: list[RunResult]) -> list[str]:
    """Markdown table of one (workload, load) point with ratios to RR and the best peer."""
    rr = next((r for r in rows if r.contender == BASELINE and not r.skipped), None)
    peer = best_peer(rows)
    out = [
        "| contender | TTFT p50 s | TTFT p90 s | TTFT p99 s | e2e p90 s | out tok/s | errors "
        "| cache hit | p90 / RR | p90 / best peer | tok/s / RR | tok/s / best peer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.skipped:
            out.append(f"| {r.contender} | skipped: {r.skipped} |" + " |" * 10)
            continue
        out.append(
            f"| {r.contender} | {r.ttft_p50:.3f} | {r.ttft_p90:.3f} | {r.ttft_p99:.3f} "
            f"| {r.e2e_p90:.2f} | {r.output_tps:.0f} | {100 * r.error_rate:.1f}% "
            f"| {100 * r.cache_hit:.0f}% "
            f"| {_ratio(r.ttft_p90, rr.ttft_p90) if rr else 'n/a'} "
            f"| {_ratio(r.ttft_p90, peer.ttft_p90) if peer else 'n/a'} "
            f"| {_ratio(r.output_tps, rr.output_tps) if rr else 'n/a'} "
            f"| {_ratio(r.output_tps, peer.output_tps) if peer else 'n/a'} |")
    if peer:
        out += ["", f"Best peer here: {peer.contender}."]
    return out


def targets(results: list[RunResult]) -> list[str]:
    """The issue's targets, checked against the run (one line each)."""
    lines = []

    def point(wl: str, load: float) -> list[RunResult]:
        return [r for r in results if r.workload == wl and abs(r.load - load) < 1e-9]

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    rows = point("shared-prefix", 0.75)
    rr = next((r for r in rows if r.contender == BASELINE and r.ok), None)
    peer = best_peer(rows)
    for name in ("epp-default", "epp-tuned"):
        ours = next((r for r in rows if r.contender == name and r.ok), None)
        if not ours or not rr:
            continue
        x = ours.ttft_p90 / rr.ttft_p90 if rr.ttft_p90 else float("inf")
        lines.append(f"- shared-prefix @ 0.75, {name}: TTFT p90 = {x:.3f} x round-robin "
                     f"(target <= 0.2): {verdict(x <= 0.2)}")
        if peer:
            y = ours.ttft_p90 / peer.ttft_p90 if peer.ttft_p90 else float("inf")
            z = ours.output_tps / peer.output_tps if peer.output_tps else float("inf")
            lines.append(f"- shared-prefix @ 0.75, {name}: TTFT p90 = {y:.2f} x best peer "
                         f"({peer.contender}) (target <= 0.8): {verdict(y <= 0.8)}; "
                         f"output tok/s = {z:.2f} x best peer (target >= 1): "
                         f"{verdict(z >= 1.0)}")
    rows = point("lora", 0.75)
    rr = next((r for r in rows if r.contender == BASELINE and r.ok), None)
    for name in ("epp-default", "epp-tuned"):
        ours = next((r for r in rows if r.contender == name and r.ok), None)
        if ours and rr:
            x = ours.ttft_p90 / rr.ttft_p90 if rr.ttft_p90 else float("inf")
            lines.append(f"- lora @ 0.75, {name}: TTFT p90 = {x:.2f} x round-robin "
                         f"(target <= 0.5): {verdict(x <= 0.5)}")
    return lines


def _peer_status() -> list[str]:
    from bench.peers import PEERS

    out = []
    for peer in PEERS.values():
        if peer.installed():
            out.append(f"{peer.package} {peer.version()}")
        else:
            out.append(f"{peer.package} not installed (`python -m bench.peers install`)")
    return out


def report(results: list[RunResult], args: argparse.Namespace, wall: float) -> str:
    """The Markdown section for RESULTS.md."""
    lines = [
        SECTION, "",
        f"Command: `{args.command.strip()}` (took {wall / 60:.1f} min on this 2-CPU machine; "
        f"seed {args.seed}). Fleet: {FLEET_SIZE} x `vllm-sim` `{PROFILE}` (unchanged profile, "
        f"time scale {args.time_scale:g}, fresh fleet per run) on 127.0.10.1-{FLEET_SIZE}; "
        "how the workloads were scaled and how to read this: `docs/benchmarks.md`. "
        "Times are model seconds (wall / time scale); \"load\" is offered rate / the "
        "workload's nominal fleet capacity; cache hit = cached / prompt tokens reported by "
        "the simulator. One run per contender and point, so differences under ~10% are noise.",
        "",
        "Peers (PyPI wheels in their own venvs under `.cache/peers/`, default thresholds): "
        + "; ".join(_peer_status()) + ".",
        "",
    ]
    tl = targets(results)
    if tl:
        lines += ["### Targets", "", *tl, ""]
    order = {name: i for i, name in enumerate(all_contenders())}
    for wl in WORKLOADS.values():
        loads = sorted({r.load for r in results if r.workload == wl.name})
        if loads:
            lines += [f"### {wl.title}", "", " ".join(wl.description.split()),
                      f"Nominal capacity {wl.capacity:.2f} req/s.", ""]
        for load in loads:
            rows = sorted((r for r in results if r.workload == wl.name and r.load == load),
                          key=lambda r: order.get(r.contender, len(order)))
            lines += [f"#### {wl.name} @ load {load:g} ({load * wl.capacity:.2f} req/s offered)",
                      "", *table(rows), ""]
    pngs = sorted(p.name for p in PLOTS.glob("compare_*.png"))
    lines += [f"![{p}](plots/{p})" for p in pngs]
    return "\n".join(lines).rstrip() + "\n"


def write_results(section: str) -> None:
    """Replace (or append) the "## Routing comparison" section of RESULTS.md."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip() + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    RESULTS.write_text(text)


def plot(results: list[RunResult]) -> list[Path]:
    """TTFT p90 and output tok/s vs offered load for each multi-load workload, and a bar
    chart of TTFT p90 for the single-load ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    PLOTS.mkdir(exist_ok=True)
    written = []
    names = list(dict.fromkeys([*all_contenders(), *(r.contender for r in results)]))
    for wl in WORKLOADS.values():
        rows = [r for r in results if r.workload == wl.name and not r.skipped and r.ok]
        if len({r.load for r in rows}) < 2:
            continue
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
        for name in names:
            pts = sorted((r.offered_rps, r.ttft_p90, r.output_tps) for r in rows
                         if r.contender == name)
            if not pts:
                continue
            style = "-o" if name.startswith("epp") else "--."
            a.plot([p[0] for p in pts], [p[1] for p in pts], style, label=name)
            b.plot([p[0] for p in pts], [p[2] for p in pts], style, label=name)
        a.set(xlabel="offered req/s", ylabel="TTFT p90 (s, log)", yscale="log",
              title=f"{wl.name}: TTFT p90")
        b.set(xlabel="offered req/s", ylabel="output tok/s", title=f"{wl.name}: throughput")
        a.legend(fontsize=7)
        fig.suptitle("python -m bench.compare", fontsize=8)
        fig.tight_layout()
        path = PLOTS / f"compare_{wl.name.replace('-', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    single = [wl for wl in WORKLOADS.values()
              if len({r.load for r in results if r.workload == wl.name}) == 1]
    if single:
        fig, axes = plt.subplots(1, len(single), figsize=(4.2 * len(single), 4.2),
                                 squeeze=False)
        for ax, wl in zip(axes[0], single, strict=True):
            rows = sorted((r for r in results
                           if r.workload == wl.name and not r.skipped and r.ok),
                          key=lambda r: names.index(r.contender))
            colors = ["tab:red" if r.kind == "ours" else "tab:gray" if r.kind == "peer"
                      else "tab:blue" for r in rows]
            ax.barh([r.contender for r in rows], [r.ttft_p90 for r in rows], color=colors)
            ax.set(xlabel="TTFT p90 (s)",
                   title=f"{wl.name} @ load {rows[0].load:g}" if rows else wl.name)
            ax.invert_yaxis()
        fig.suptitle("python -m bench.compare", fontsize=8)
        fig.tight_layout()
        path = PLOTS / "compare_workloads.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# -- main ----------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="CI smoke: shared-prefix at load 0.3 for 4 model s (time scale 0.25) per "
                        "contender; asserts "
                        "only that every available contender completed")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    p.add_argument("--loads", default="", help="override every workload's loads (fractions)")
    p.add_argument("--contenders", default="", help="comma-separated subset")
    p.add_argument("--duration", type=float, default=0.0,
                   help="arrival window per run, model seconds (default: the workload's)")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=90.0, help="per-request limit (wall s)")
    p.add_argument("--no-write", action="store_true",
                   help="do not touch RESULTS.md / plots")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--report-only", type=Path, default=None, metavar="RUN_DIR",
                   help="rebuild tables, plots and RESULTS.md from RUN_DIR/results.json")
    args = p.parse_args(argv)
    if args.quick:
        # 4x faster simulated time: the runs are startup-bound, the numbers don't matter.
        args.workloads, args.loads, args.duration = "shared-prefix", "0.3", 4.0
        args.time_scale, args.no_write, args.timeout = 0.25, True, 30.0
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; exit status 1 when a run failed (quick: any contender)."""
    args = parse_args(argv)
    if args.report_only:
        saved = json.loads((args.report_only / "results.json").read_text())
        meta = saved["meta"] if isinstance(saved, dict) else {}
        rows = saved["results"] if isinstance(saved, dict) else saved
        loaded = [RunResult(**r) for r in rows]
        args.command = meta.get("command", "python -m bench.compare")
        args.seed, args.time_scale = meta.get("seed", 0), meta.get("time_scale", 1.0)
        plot(loaded)
        section = report(loaded, args, float(meta.get("wall", 0.0)))
        write_results(section)
        print(section)
        return 0
    args.command = "python -m bench.compare " + " ".join(sys.argv[1:] if argv is None else argv)
    contenders = all_contenders()
    if args.contenders:
        contenders = {k: contenders[k] for k in args.contenders.split(",")}
    run_dir = RUNS / time.strftime("%Y%m%d-%H%M%S")
    started = time.monotonic()
    results: list[RunResult] = []
    flip = False
    for wl_name in args.workloads.split(","):
        wl = WORKLOADS[wl_name]
        loads = [float(x) for x in args.loads.split(",")] if args.loads else list(wl.loads)
        for load in loads:
            order = list(contenders.values())
            if flip:
                order.reverse()
            flip = not flip
            for c in order:
                workdir = run_dir / wl.name / f"{load:g}" / c.name.replace(":", "-")
                try:
                    res = run_one(wl, load, c, duration=args.duration or wl.duration,
                                  seed=args.seed, time_scale=args.time_scale, workdir=workdir,
                                  progress=not args.no_progress, timeout=args.timeout)
                except Exception as exc:  # a contender that fails to start is a result too
                    res = RunResult(wl.name, load, load * wl.capacity, c.name, c.kind,
                                    skipped=f"failed: {type(exc).__name__}: {exc}"[:300])
                results.append(res)
                print(f"{wl.name:13s} load {load:<4g} {c.name:26s} "
                      + (f"SKIPPED {res.skipped}" if res.skipped else
                         f"ok {res.ok}/{res.requests} TTFT p50 {res.ttft_p50:.3f} "
                         f"p90 {res.ttft_p90:.3f} s  e2e p90 {res.e2e_p90:.2f} s  "
                         f"{res.output_tps:.0f} tok/s  hit {100 * res.cache_hit:.0f}%  "
                         f"({res.wall_seconds:.0f} s)"),
                      file=sys.stderr, flush=True)
    wall = time.monotonic() - started
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {"command": args.command.strip(), "seed": args.seed, "time_scale": args.time_scale,
            "wall": wall}
    (run_dir / "results.json").write_text(
        json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1))
    if not args.no_write:
        plot(results)
    section = report(results, args, wall)
    print(section)
    if not args.no_write:
        write_results(section)
    print(f"raw outcomes: {run_dir}  ({wall:.0f} s)", file=sys.stderr)
    failed = [r for r in results
              if (r.skipped.startswith("failed") or (not r.skipped and r.ok == 0))]
    if args.quick:
        failed += [r for r in results if not r.skipped and r.errors]
    for r in failed:
        print(f"FAILED: {r.workload} {r.load:g} {r.contender}: "
              f"{r.skipped or r.error_samples}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
