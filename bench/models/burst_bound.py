"""How far any dispatch order can take bursts' TTFT p90 below round-robin's: a prefill-only
model of the fleet on the same seeded schedules as ``bench/scenarios/flowcontrol-bursts.yaml``.

    python -m bench.models.burst_bound             # seeds 0-4, bursts @ 0.75
    python -m bench.models.burst_bound --workload sharegpt --gamma 2 --seeds 0,...,19
                                                   # gamma.yaml's schedules (20 s windows)

Each server prefills one request at a time (the ``8b-h100`` profile's 30 ms + 0.25 ms per
prompt token; decode ignored, which only adds to every order alike). TTFT = end of the
request's prefill - its arrival. Compared: round-robin by arrival (what Envoy does), one
global first-come queue released to the first free server (flow control with late
binding), and one global shortest-prompt-first queue (a reordering no upstream ordering
policy offers). A burst offers 12x the fleet's prefill rate for 0.5 s, so every
work-conserving order ends the burst at the same time; only the order inside it moves p90.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import statistics
from collections.abc import Callable

from bench.workloads import FLEET_SIZE, WORKLOADS, RequestSpec
from devkit.stats import percentile as pct

OVERHEAD, PER_TOKEN, BYTES_PER_TOKEN = 0.030, 0.000250, 4


def prefill(s: RequestSpec) -> float:
    return OVERHEAD + len(s.body["prompt"]) / BYTES_PER_TOKEN * PER_TOKEN


def round_robin(specs: list[RequestSpec], n: int) -> list[float]:
    free = [0.0] * n
    out = []
    for i, s in enumerate(specs):
        k = i % n
        free[k] = max(free[k], s.at) + prefill(s)
        out.append(free[k] - s.at)
    return out


def global_queue(specs: list[RequestSpec], n: int,
                 key: Callable[[RequestSpec], float]) -> list[float]:
    free = [0.0] * n
    waiting: list[tuple[float, int, RequestSpec]] = []
    out, i = [], 0
    while i < len(specs) or waiting:
        k = free.index(min(free))
        if not waiting:  # idle until the next arrival
            free[k] = max(free[k], specs[i].at)
        while i < len(specs) and specs[i].at <= free[k]:
            heapq.heappush(waiting, (key(specs[i]), i, specs[i]))
            i += 1
        if not waiting:
            continue
        _, _, s = heapq.heappop(waiting)
        free[k] = max(free[k], s.at) + prefill(s)
        out.append(free[k] - s.at)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--load", type=float, default=0.75)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--workload", default="bursts", choices=sorted(WORKLOADS))
    p.add_argument("--gamma", type=float, metavar="CV", help="Gamma arrival gaps of this CV")
    args = p.parse_args(argv)
    w = WORKLOADS[args.workload]
    if args.gamma:
        w = dataclasses.replace(w, arrivals="gamma", burst_period=args.gamma)
    print("| seed | RR p90 s | FCFS p90 s | FCFS / RR | SJF p90 s | SJF / RR |")
    print("|---|---:|---:|---:|---:|---:|")
    ratios: list[tuple[float, float]] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        specs = w.schedule(args.load, args.duration, seed)
        rr = pct(round_robin(specs, FLEET_SIZE), 0.9)
        fcfs = pct(global_queue(specs, FLEET_SIZE, lambda s: s.at), 0.9)
        sjf = pct(global_queue(specs, FLEET_SIZE, prefill), 0.9)
        ratios.append((fcfs / rr, sjf / rr))
        print(f"| {seed} | {rr:.2f} | {fcfs:.2f} | {fcfs / rr:.2f} | {sjf:.2f} | "
              f"{sjf / rr:.2f} |")
    print(f"| median | | | {statistics.median(r[0] for r in ratios):.2f} | | "
          f"{statistics.median(r[1] for r in ratios):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
