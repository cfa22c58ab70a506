"""A quiet tenant under a noisy one (issue #14's second target).

    python -m bench.flowcontrol_noisy                     # 5 seeds
    python -m bench.flowcontrol_noisy --seeds 0 --duration 10

Three quiet tenants each send the ShareGPT-like mix at 0.1x the fleet's capacity (Poisson);
a noisy tenant sends 10x that (1.0x capacity), so the pool is offered 1.3x what it can do.
Each tenant names itself in ``x-gateway-inference-fairness-id``. Per seed and contender: one
run with the quiet tenants alone ("solo") and one with the noisy tenant flooding.

Reported, median over seeds with [min, max]:
- quiet TTFT p90 flood / solo (target <= 1.5);
- Jain's fairness index of per-tenant goodput (requests completed while the noisy tenant
  floods, i.e. within the arrival window) normalized by each tenant's max-min fair share of
  the goodput the run achieved (1 = every tenant got its fair share; target >= 0.9).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass, replace
from typing import cast

import orjson

from bench.compare import RUNS, run_one
from bench.contenders import TUNED_CONFIG, Contender, EnvoyLB, Epp
from bench.loadgen import percentile as pct
from bench.openloop import Outcome
from bench.workloads import FLEET_SIZE, WORKLOADS, RequestSpec, Workload, lengths, poisson_arrivals

QUIET = ("quiet-a", "quiet-b", "quiet-c")
NOISY = "noisy"
QUIET_SHARE = 0.1  # of capacity, per quiet tenant
NOISY_FACTOR = 10

FAIR_CONFIG = TUNED_CONFIG.replace("plugins:\n", """plugins:
- type: utilization-detector
  parameters: {queueDepthThreshold: 1}
- type: round-robin-fairness-policy
""", 1) + """\
featureGates:
- flowControl
flowControl:
  defaultRequestTTL: 60s
  defaultPriorityBand:
    fairnessPolicyRef: round-robin-fairness-policy
"""


#: Request lengths and nominal capacity: the ShareGPT-like mix of ``bench/workloads``.
SHAREGPT = WORKLOADS["sharegpt"]


@dataclass(frozen=True)
class TenantMix:
    """The quiet tenants, plus the noisy one when ``noisy``: ShareGPT-like requests, each
    tenant with its fairness id header; ``load`` 1.0 = the fleet's nominal capacity."""

    name: str
    noisy: bool

    def capacity(self, servers: int = FLEET_SIZE) -> float:
        return SHAREGPT.capacity(servers)

    def schedule(self, load: float, duration: float, seed: int = 0,
                 servers: int = FLEET_SIZE) -> list[RequestSpec]:
        rng = random.Random(f"{self.name}:{seed}")
        rate = load * self.capacity(servers)
        tenants = [(t, rate * QUIET_SHARE) for t in QUIET]
        if self.noisy:
            tenants.append((NOISY, rate * QUIET_SHARE * NOISY_FACTOR))
        specs = []
        for tenant, r in tenants:
            times = poisson_arrivals(rng, r, max(1, round(r * duration)))
            specs += [replace(s, tag=tenant,
                              headers={"x-gateway-inference-fairness-id": tenant})
                      for s in lengths(rng, SHAREGPT.parameters, times)]
        return sorted(specs, key=lambda s: s.at)


def contenders() -> list[Contender]:
    return [EnvoyLB("envoy-rr", "ROUND_ROBIN"), Epp("epp-tuned", TUNED_CONFIG),
            Epp("epp-flowcontrol-fair", FAIR_CONFIG)]


def max_min_shares(demands: dict[str, float], total: float) -> dict[str, float]:
    """Water-filling: each tenant gets min(demand, equal split of what is left)."""
    shares: dict[str, float] = {}
    left, pending = total, dict(demands)
    while pending:
        split = left / len(pending)
        small = {t: d for t, d in pending.items() if d <= split}
        if not small:
            shares.update({t: split for t in pending})
            break
        for t, d in small.items():
            shares[t] = d
            left -= d
            del pending[t]
    return shares


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


def per_tenant(specs: list[RequestSpec], outcomes: list[Outcome], time_scale: float,
               window: float) -> tuple[dict[str, list[float]], dict[str, int]]:
    """TTFTs (model s) of every completed request, and per tenant the requests completed
    within the arrival window (``window`` model s: while the noisy tenant floods)."""
    ttft: dict[str, list[float]] = {}
    done: dict[str, int] = {}
    for spec, o in zip(specs, outcomes, strict=True):
        if o.ok and o.ttft is not None:
            ttft.setdefault(spec.tag, []).append(o.ttft / time_scale)
            if (o.start + (o.e2e or 0.0)) / time_scale <= window:
                done[spec.tag] = done.get(spec.tag, 0) + 1
    return ttft, done


def spread(values: list[float]) -> str:
    values = [v for v in values if v == v]  # drop NaN
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--duration", type=float, default=20.0, help="model seconds per run")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--contenders", default="", help="comma-separated subset")
    p.add_argument("--servers", type=int, default=FLEET_SIZE)
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    cs = [c for c in contenders()
          if not args.contenders or c.name in args.contenders.split(",")]
    run_dir = RUNS / f"flowcontrol-noisy-{time.strftime('%Y%m%d-%H%M%S')}"
    rows: dict[str, list[dict[str, float]]] = {}
    for i, seed in enumerate(seeds):
        for c in cs[i % len(cs):] + cs[:i % len(cs)]:
            row: dict[str, float] = {}
            for noisy in (False, True):
                w = TenantMix("noisy" if noisy else "quiet", noisy)
                workdir = run_dir / f"{seed}-{c.name}-{w.name}"
                res = run_one(cast(Workload, w), 1.0, c, duration=args.duration, seed=seed,
                              servers=args.servers,
                              time_scale=args.time_scale, workdir=workdir, progress=False,
                              timeout=args.timeout)
                specs = w.schedule(1.0, args.duration, seed, args.servers)
                outcomes = [Outcome(**orjson.loads(line)) for line in
                            (workdir / "outcomes.jsonl").read_bytes().splitlines()]
                ttft, done = per_tenant(specs, outcomes, args.time_scale, args.duration)
                quiet = [t for q in QUIET for t in ttft.get(q, [])]
                row[f"{w.name}_quiet_p90"] = pct(quiet, 0.9)
                row[f"{w.name}_errors"] = res.errors
                if noisy:
                    demand = {t: sum(1 for s in specs if s.tag == t) / args.duration
                              for t in (*QUIET, NOISY)}
                    goodput = {t: done.get(t, 0) / args.duration for t in demand}
                    fair = max_min_shares(demand, sum(goodput.values()))
                    # Nothing completed within the window: no share to compare (NaN).
                    row["jain"] = (jain([goodput[t] / fair[t] for t in demand])
                                   if all(fair.values()) else float("nan"))
                    row["noisy_goodput_share"] = goodput[NOISY] / max(1e-9,
                                                                      sum(goodput.values()))
            row["ratio"] = row["noisy_quiet_p90"] / row["quiet_quiet_p90"]
            rows.setdefault(c.name, []).append(row)
            print(f"seed {seed} {c.name}: quiet p90 solo {row['quiet_quiet_p90']:.3f} s, "
                  f"flood {row['noisy_quiet_p90']:.3f} s (x{row['ratio']:.2f}), "
                  f"Jain {row['jain']:.3f}, errors {row['noisy_errors']:.0f}", flush=True)
    print(f"\nnoisy tenant, seeds {seeds}: median [min, max] over seeds")
    print("| contender | quiet TTFT p90 solo s | with flood s | flood / solo | Jain | "
          "noisy share of goodput | errors (flood) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, rs in rows.items():
        def col(k: str, rs: list[dict[str, float]] = rs) -> str:
            return spread([r[k] for r in rs])
        print(f"| {name} | {col('quiet_quiet_p90')} | {col('noisy_quiet_p90')} | "
              f"{col('ratio')} | {col('jain')} | {col('noisy_goodput_share')} | "
              f"{sum(r['noisy_errors'] for r in rs):.0f} |")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
