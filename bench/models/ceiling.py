"""How many sheddable requests may run beside critical ones on each server before the
critical TTFT p90 passes 1.3x its idle value: the simulator's engines in virtual time, no
Envoy, EPP or load generator (so no CPU contention; no lock needed).

    python -m bench.models.ceiling        # N = 0..4, 8 servers, 5 seeds, 200 s each
    python -m bench.models.ceiling --sheddable 0,2,4 --seeds 0 --duration 60

``bench/scenarios/priority-flood.yaml`` sends critical requests at 0.3x the fleet's capacity while a
sheddable flood keeps the EPP's sheddable band full; flow control then keeps the pool's
sheddable requests in flight at the band's usage ceiling (``priority-usage-limit-policy``
threshold x ``maxConcurrency`` x servers: 0.5 x 8 x 8 = 32, about 4 per server). Critical
requests never wait in the EPP (their band has the whole pool) but share engine steps with
those sheddable requests. This model isolates that: ``--servers`` engines of the benchmark's
profile (:mod:`sim.engine`, vLLM V1's token budget and chunked prefill), critical requests
of the ShareGPT-like mix arriving Poisson at 0.3x the fleet's capacity, each sent to the
server with the fewest requests, and ``N`` sheddable requests of the same mix always in
flight on every server (each replaced when it finishes, as a waiting flood would). Reported
per ``N``: critical TTFT p50/p90, p90 / p90 at ``N = 0`` (median and [min, max] over
seeds), and the sheddable requests completed per second per server.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections.abc import Callable

import orjson

from bench.workloads import WORKLOADS, RequestSpec, lengths, poisson_arrivals
from devkit.stats import percentile as pct
from sim.engine import Engine, SimRequest
from sim.openai import parse_request
from sim.profiles import get_profile

SHAREGPT = WORKLOADS["sharegpt"]


def run(n_sheddable: int, critical_load: float, duration: float, seed: int,
        servers: int = 1, token_budget: int = 0) -> tuple[list[float], float]:
    """Critical TTFTs (model seconds) and sheddable completions per second per server.
    A critical request goes to the server with the fewest requests (running + waiting),
    the lowest index on ties; each server keeps ``n_sheddable`` sheddable ones.
    ``token_budget`` > 0 replaces the profile's ``max_num_batched_tokens``."""
    profile = get_profile("8b-h100")
    if token_budget:
        profile = profile.with_overrides({"max_num_batched_tokens": token_budget})
    engines = [Engine(profile, seed=seed + k) for k in range(servers)]
    rng = random.Random(f"ceiling:critical:{seed}")
    rate = critical_load * SHAREGPT.per_server * servers
    arrivals = lengths(rng, SHAREGPT.parameters,
                       poisson_arrivals(rng, rate, max(1, round(rate * duration))))
    shed_rng = random.Random(f"ceiling:sheddable:{seed}")
    ttft: dict[str, float] = {}
    critical: dict[str, float] = {}   # request id -> arrival
    ids = iter(range(1 << 62))
    finished_sheddable = 0
    replace: list[tuple[int, float]] = []
    step_end: list[float | None] = [None] * servers

    def add(k: int, spec: RequestSpec, t: float, is_critical: bool) -> None:
        parsed = parse_request(orjson.dumps(spec.body),
                               chat=spec.path.endswith("/chat/completions"))
        rid = f"{'c' if is_critical else 's'}{next(ids)}"
        req = engines[k].new_request(parsed.prompt, parsed.max_tokens or 16, now=t,
                                     request_id=rid)
        if is_critical:
            critical[rid] = t
        engines[k].add(req)

    def hook(k: int) -> Callable[[str, SimRequest, float], None]:
        def on(kind: str, req: SimRequest, t: float) -> None:
            nonlocal finished_sheddable
            if req.id in critical:
                if kind == "first_token":
                    ttft[req.id] = t - critical[req.id]
            elif kind == "finish":
                finished_sheddable += 1
                if t < duration:
                    replace.append((k, t))  # added once the step is over
        return on

    def start(k: int, now: float) -> None:
        e = engines[k]
        if step_end[k] is None and e.has_work:
            end = e.begin_step(now)
            if end == now and not e.running:  # nothing fits (cannot happen here)
                e.finish_step()
                return
            step_end[k] = end
            heapq.heappush(events, (end, 0, k))

    for k, e in enumerate(engines):
        e.on_event = hook(k)
        for _ in range(n_sheddable):
            add(k, lengths(shed_rng, SHAREGPT.parameters, [0.0])[0], 0.0, False)
    events: list[tuple[float, int, int]] = [(s.at, 1, i) for i, s in enumerate(arrivals)]
    heapq.heapify(events)
    for k in range(servers):
        start(k, 0.0)
    while events:
        now, kind, x = heapq.heappop(events)
        if kind == 0:  # server x's step ends
            step_end[x] = None
            engines[x].finish_step()
            for k, t in replace:
                add(k, lengths(shed_rng, SHAREGPT.parameters, [t])[0], t, False)
            replace.clear()
            start(x, now)
        else:  # critical request x arrives
            k = min(range(servers),
                    key=lambda j: engines[j].num_running + engines[j].num_waiting)
            add(k, arrivals[x], now, True)
            start(k, now)
    return list(ttft.values()), finished_sheddable / duration / servers


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sheddable", default="0,1,2,3,4",
                   help="sheddable requests kept in flight on the server")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--critical-load", type=float, default=0.3)
    p.add_argument("--duration", type=float, default=200.0, help="model seconds per run")
    p.add_argument("--servers", type=int, default=8,
                   help="servers (critical requests go to the least busy one)")
    p.add_argument("--max-num-batched-tokens", type=int, default=0,
                   help="vLLM's per-step token budget (default: the profile's, 8192)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    idle: dict[int, float] = {}
    print(f"critical at {args.critical_load}x capacity, {args.servers} servers, "
          f"{args.duration:.0f} model s per run, seeds {seeds}")
    print("| sheddable in flight | critical TTFT p50 s | p90 s | p90 / idle p90 | "
          "sheddable done /s per server |")
    print("|---:|---:|---:|---:|---:|")
    for n in [int(x) for x in args.sheddable.split(",")]:
        p50s, p90s, ratios, rates = [], [], [], []
        for seed in seeds:
            ttfts, shed_rate = run(n, args.critical_load, args.duration, seed, args.servers,
                                   args.max_num_batched_tokens)
            p50s.append(pct(ttfts, 0.5))
            p90s.append(pct(ttfts, 0.9))
            if n == 0:
                idle[seed] = p90s[-1]
            if seed in idle:
                ratios.append(p90s[-1] / idle[seed])
            rates.append(shed_rate)
        ratio = (f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"
                 if ratios else "n/a (run N=0 too)")
        print(f"| {n} | {statistics.median(p50s):.3f} | {statistics.median(p90s):.3f} | "
              f"{ratio} | {statistics.median(rates):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
