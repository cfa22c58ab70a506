"""Does the twin agree with the real-time stack? Same workload, seed and fleet, both ways.

    python -m bench.twin.agreement                      # make bench-agreement: a short live case
    python -m bench.twin.agreement --from-run .cache/bench-compare/<timestamp> [--epp-cpus 1]

Live: ``envoy-rr`` and ``epp-default`` run for real (``bench.runner.run_one``: simulator
processes, real Envoy, the EPP process) and in the twin, on the same schedule. ``--from-run``
replays every ``envoy-rr`` / ``epp-default`` / ``epp-tuned`` run of a saved ``bench.compare``
run in the twin instead (no new real-time runs). ``--epp-cpus N`` gives the twin's EPP the
measured CPU model at that budget (:class:`bench.twin.cpu.ProcessCpu`), as ``bench.compare
--router-cpus N`` gave the real one. Compared: TTFT p50, TTFT p90 and output tok/s of the warm
requests; the twin agrees when each is within :data:`TOLERANCE` of the real figure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import report as rp
from bench.report import RunResult
from bench.runner import twin_run
from bench.twin.cpu import MEASURED_COST, ProcessCpu
from bench.workloads import WORKLOADS

TOLERANCE = 0.15
CONTENDERS = ("envoy-rr", "epp-default")
#: What a saved run is replayed for (the routers the twin has).
REPLAYED = (*CONTENDERS, "epp-tuned")
SECTION = "## Twin agreement"
METRICS = (("TTFT p50", "ttft_p50"), ("TTFT p90", "ttft_p90"), ("out tok/s", "output_tps"))


@dataclass(frozen=True, slots=True)
class Pair:
    """One real run and the twin's run of the same (workload, load, seed, servers)."""

    real: RunResult
    twin: RunResult

    def diffs(self) -> dict[str, float]:
        """Relative difference (twin - real) / real per metric."""
        out = {}
        for label, attr in METRICS:
            real = getattr(self.real, attr)
            out[label] = (getattr(self.twin, attr) - real) / real if real else float("inf")
        return out

    @property
    def agrees(self) -> bool:
        return all(abs(d) <= TOLERANCE for d in self.diffs().values())


def twin_of(real: RunResult, duration: float, cpu: ProcessCpu | None = None) -> RunResult:
    """The twin's run matching ``real`` (``cpu``: the EPP's CPU model, None: free)."""
    return twin_run(real.workload, real.load, real.servers, real.seed, real.contender, duration,
                    cpu=cpu)


def live(workload: str, load: float, seed: int, servers: int, duration: float,
         workdir: Path, cpu: ProcessCpu | None = None) -> list[Pair]:
    """Run ``envoy-rr`` and ``epp-default`` for real, then in the twin."""
    from bench.contenders import all_contenders
    from bench.runner import run_one

    pairs = []
    for name in CONTENDERS:
        real = run_one(WORKLOADS[workload], load, all_contenders()[name], duration=duration,
                       seed=seed, servers=servers, time_scale=1.0,
                       workdir=workdir / name, progress=False, timeout=60.0)
        pairs.append(Pair(real, twin_of(real, duration, cpu)))
    return pairs


def table(pairs: list[Pair]) -> list[str]:
    out = ["| workload | seed | servers | contender | " + " | ".join(
        f"{label} real / twin / diff" for label, _ in METRICS) + " | within 15% |",
        "|---|---:|---:|---|" + "---:|" * len(METRICS) + "---|"]
    for p in pairs:
        d = p.diffs()
        cells = " | ".join(f"{getattr(p.real, a):.3f} / {getattr(p.twin, a):.3f} / "
                           f"{100 * d[label]:+.0f}%" for label, a in METRICS)
        out.append(f"| {p.real.workload} @ {p.real.load:g} | {p.real.seed} | "
                   f"{p.real.servers} | {p.real.contender} | {cells} | "
                   f"{'yes' if p.agrees else '**no**'} |")
    n = sum(p.agrees for p in pairs)
    out += ["", f"{n} of {len(pairs)} pairs agree within {100 * TOLERANCE:.0f}% on all three."]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.twin.agreement", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from-run", type=Path, default=None, metavar="RUN_FILE",
                    help="replay the envoy-rr/epp-default runs of a real-time run saved by "
                         "`python -m bench run ... --real --save` (bench/runs/*-real-*.json)")
    ap.add_argument("--workload", default="sharegpt")
    ap.add_argument("--load", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--duration", type=float, default=12.0, help="model seconds")
    ap.add_argument("--epp-cpus", type=float, default=0.0,
                    help="the twin's EPP CPU budget, with the measured costs "
                         "(bench/twin/epp_cost.json); 0: free CPU")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    def cpu(servers: int) -> ProcessCpu | None:
        return (ProcessCpu.measured(MEASURED_COST, args.epp_cpus, servers)
                if args.epp_cpus > 0 else None)
    command = "python -m bench.twin.agreement " + " ".join(
        sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    if args.from_run is not None:
        from bench.runner import load_run

        try:
            made_by, duration, results = load_run(args.from_run)
        except (OSError, ValueError, KeyError) as e:
            ap.error(f"--from-run: {args.from_run}: not a saved run ({type(e).__name__}: {e})")
        pairs = [Pair(r, twin_of(r, duration, cpu(r.servers)))
                 for r in results if r.contender in REPLAYED and r.usable]
        source = f"the real runs of `{made_by}`"
    else:
        if args.workload not in WORKLOADS:
            ap.error(f"--workload: unknown workload {args.workload!r}")
        with tempfile.TemporaryDirectory() as tmp:
            pairs = live(args.workload, args.load, args.seed, args.servers, args.duration,
                         Path(tmp), cpu(args.servers))
        source = "live runs made by the command"
    lines = [SECTION, "",
             f"Command: `{command.strip()}` ({time.monotonic() - started:.0f} s; compared "
             f"with {source}). Warm requests only (first 20% left out), model seconds. "
             "The twin's EPP CPU: " + (f"{args.epp_cpus:g} CPU, measured costs "
                                       f"({MEASURED_COST.name})." if args.epp_cpus > 0
                                       else "free."), "",
             *table(pairs)]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write and args.from_run is not None:
        rp.write_section(SECTION, text)
    return 0 if all(p.agrees for p in pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
