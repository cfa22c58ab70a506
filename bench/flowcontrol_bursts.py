"""Flow control under bursts: the EPP with flow control against Envoy round-robin and the EPP
without it, on the same seeded burst schedules (issue #14's first target).

    python -m bench.flowcontrol_bursts                    # 5 seeds, bursts @ 0.75
    python -m bench.flowcontrol_bursts --seeds 0,1 --duration 10

Per seed every contender gets one run (fresh fleet, order rotated per seed). Reported: each
contender's TTFT p90 and output tok/s per seed, and the median over seeds of the per-seed
ratios to round-robin with their [min, max] range (5 seeds are too few for a bootstrap
interval worth its name).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.compare import RUNS, RunResult, run_one
from bench.contenders import TUNED_CONFIG, Contender, EnvoyLB, Epp
from bench.flowcontrol_probe import FlowEpp
from bench.workloads import FLEET_SIZE, WORKLOADS

#: TUNED_CONFIG plus flow control: requests wait in the EPP while the pool is saturated, with
#: a small per-server queue so late binding has something to choose.
FLOW_CONTROL_CONFIG = TUNED_CONFIG + """\
featureGates:
- flowControl
flowControl:
  defaultRequestTTL: 60s
"""


def fc_config(queue_depth: int) -> str:
    """FLOW_CONTROL_CONFIG with the utilization detector's queue threshold set."""
    return FLOW_CONTROL_CONFIG.replace("plugins:\n", "plugins:\n- type: utilization-detector\n"
                                       f"  parameters: {{queueDepthThreshold: {queue_depth}}}\n",
                                       1)


def concurrency_config(max_concurrency: int) -> str:
    """FLOW_CONTROL_CONFIG dispatching on upstream's ``concurrency-detector`` (requests in
    flight per endpoint) instead of the scraped queue; also a filter, so no endpoint goes
    past it."""
    return FLOW_CONTROL_CONFIG.replace("plugins:\n", f"""plugins:
- type: concurrency-detector
  parameters: {{maxConcurrency: {max_concurrency}}}
""", 1).replace("  plugins:\n", "  plugins:\n  - pluginRef: concurrency-detector\n", 1) + \
        "saturationDetector: {pluginRef: concurrency-detector}\n"


def contenders() -> list[Contender]:
    return [EnvoyLB("envoy-rr", "ROUND_ROBIN"), Epp("epp-tuned", TUNED_CONFIG),
            Epp("epp-flowcontrol", FLOW_CONTROL_CONFIG),
            Epp("epp-flowcontrol-q1", fc_config(1)), Epp("epp-flowcontrol-q2", fc_config(2)),
            *(FlowEpp(f"epp-flowcontrol-c{n}", concurrency_config(n)) for n in (4, 8, 16))]


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    return (f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--contenders", default="", help="comma-separated subset")
    p.add_argument("--load", type=float, default=0.75)
    p.add_argument("--duration", type=float, default=20.0, help="model seconds per run")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=90.0)
    p.add_argument("--servers", type=int, default=FLEET_SIZE)
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    workload = WORKLOADS["bursts"]
    run_dir = RUNS / f"flowcontrol-bursts-{time.strftime('%Y%m%d-%H%M%S')}"
    rows: dict[str, dict[int, RunResult]] = {}
    cs = [c for c in contenders()
          if not args.contenders or c.name in args.contenders.split(",")]
    for i, seed in enumerate(seeds):
        order = cs[i % len(cs):] + cs[:i % len(cs)]
        for c in order:
            res = run_one(workload, args.load, c, duration=args.duration, seed=seed,
                          servers=args.servers,
                          time_scale=args.time_scale, workdir=run_dir / f"{seed}-{c.name}",
                          progress=False, timeout=args.timeout)
            rows.setdefault(c.name, {})[seed] = res
            print(f"seed {seed} {c.name}: TTFT p90 {res.ttft_p90:.3f} s, "
                  f"{res.output_tps:.0f} tok/s, errors {res.errors}", flush=True)
    rr = rows["envoy-rr"]
    print(f"\nbursts @ {args.load}, seeds {seeds}: median [min, max] over seeds")
    print("| contender | TTFT p90 s | out tok/s | errors | p90 / RR | tok/s / RR |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, by_seed in rows.items():
        p90 = [r.ttft_p90 for r in by_seed.values()]
        tps = [r.output_tps for r in by_seed.values()]
        errs = sum(r.errors for r in by_seed.values())
        p90r = [by_seed[s].ttft_p90 / rr[s].ttft_p90 for s in by_seed if rr[s].ttft_p90]
        tpsr = [by_seed[s].output_tps / rr[s].output_tps for s in by_seed if rr[s].output_tps]
        print(f"| {name} | {spread(p90)} | {spread(tps)} | {errs} | {spread(p90r)} | "
              f"{spread(tpsr)} |")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(
        {n: {s: r.__dict__ for s, r in b.items()} for n, b in rows.items()}, indent=1,
        default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
