"""A quiet tenant under a noisy one (issue #14's second target).

    python -m bench.flowcontrol_noisy                     # 5 seeds
    python -m bench.flowcontrol_noisy --seeds 0 --duration 10

Three quiet tenants each send the ShareGPT-like mix at 0.1x the fleet's capacity (Poisson);
a noisy tenant sends 10x that (1.0x capacity), so the pool is offered 1.3x what it can do.
Each tenant names itself in ``x-gateway-inference-fairness-id``. Per seed and contender: one
run with the quiet tenants alone ("solo") and one with the noisy tenant flooding.

Reported, median over seeds with [min, max]:
- quiet TTFT p90 flood / solo (target <= 1.5);
- Jain's fairness index of per-tenant goodput: output tokens each tenant received while the
  noisy tenant floods (within the arrival window; each token counted when it reached the
  client), each normalized by the tenant's max-min fair share of all tokens delivered in
  that window, with demand = the output tokens the tenant asked for in it (1 = every tenant
  got its fair share; target >= 0.9).

  An earlier version counted *requests completed* within the window. Under the flood a
  request's end-to-end time (10-17 s in this simulator, decode stretched by other
  requests' prefills) is close to the 20 s window, so that count saw only the first few
  seconds' arrivals and measured latency, not shares; it is still printed as "Jain
  (completed)" for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import orjson

from bench import cpubudget
from bench.compare import RUNS, run_one
from bench.contenders import TUNED_CONFIG, Contender, EnvoyLB, Epp
from bench.flowcontrol_probe import FlowEpp
from bench.openloop import Outcome
from bench.stats import bootstrap_median
from bench.workloads import FLEET_SIZE, WORKLOADS, RequestSpec, Workload, lengths, poisson_arrivals
from devkit.stats import percentile as pct

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

    #: run_one's per-class report is not used; this bench splits classes itself.
    by_class = False

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


def concurrency_config(max_concurrency: int,
                       fairness: str = "round-robin-fairness-policy",
                       max_prefill: int | None = None) -> str:
    """TUNED_CONFIG + flow control with ``fairness`` between the tenants, dispatching on
    upstream's ``concurrency-detector`` (requests in flight per endpoint) instead of the
    scraped queue; also a filter, so no endpoint goes past it. ``max_prefill``: its
    ``maxPrefillConcurrency`` (ours; requests per endpoint awaiting their first token)."""
    prefill = "" if max_prefill is None else f", maxPrefillConcurrency: {max_prefill}"
    return TUNED_CONFIG.replace("plugins:\n", f"""plugins:
- type: concurrency-detector
  parameters: {{maxConcurrency: {max_concurrency}{prefill}}}
- type: {fairness}
""", 1).replace("  plugins:\n", "  plugins:\n  - pluginRef: concurrency-detector\n", 1) + f"""\
saturationDetector: {{pluginRef: concurrency-detector}}
featureGates:
- flowControl
flowControl:
  defaultRequestTTL: 60s
  defaultPriorityBand:
    fairnessPolicyRef: {fairness}
"""


def token_concurrency_config(max_tokens: int) -> str:
    """:func:`concurrency_config` counting estimated prompt tokens in flight per endpoint
    (``concurrencyMode: tokens``) instead of requests."""
    return concurrency_config(1).replace(
        "parameters: {maxConcurrency: 1}",
        f"parameters: {{concurrencyMode: tokens, maxTokenConcurrency: {max_tokens}}}", 1)


def contenders() -> list[Contender]:
    return [EnvoyLB("envoy-rr", "ROUND_ROBIN"), Epp("epp-tuned", TUNED_CONFIG),
            FlowEpp("epp-flowcontrol-fair", FAIR_CONFIG),
            *(FlowEpp(f"epp-flowcontrol-fair-c{n}", concurrency_config(n))
              for n in (4, 8, 16)),
            *(FlowEpp(f"epp-flowcontrol-least-c{n}",
                      concurrency_config(n, "least-inflight-fairness-policy"))
              for n in (6, 8, 10)),
            *(FlowEpp(f"epp-flowcontrol-least-c{n}-p1",
                      concurrency_config(n, "least-inflight-fairness-policy", 1))
              for n in (8, 12))]


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


def tokens_within(specs: list[RequestSpec], outcomes: list[Outcome], time_scale: float,
                  window: float) -> tuple[dict[str, float], dict[str, float]]:
    """Per tenant: output tokens the client received by ``window`` (model s from the run's
    start; token k arrives at start + TTFT + the first k-1 inter-token gaps), and
    :func:`tokens_asked` within the window."""
    got: dict[str, float] = {}
    for spec, o in zip(specs, outcomes, strict=True):
        if o.status != 200 or o.ttft is None:
            continue
        t = o.start + o.ttft
        n = 0
        for gap in (0.0, *o.itl):
            t += gap
            if t / time_scale > window:
                break
            n += 1
        got[spec.tag] = got.get(spec.tag, 0) + n
    return got, tokens_asked(specs, window)


def tokens_asked(specs: list[RequestSpec], window: float) -> dict[str, float]:
    """Per tenant: the output tokens (``max_tokens``) its requests arriving by ``window``
    asked for."""
    asked: dict[str, float] = {}
    for spec in specs:
        if spec.at <= window:
            asked[spec.tag] = asked.get(spec.tag, 0) + int(spec.body.get("max_tokens", 0))
    return asked


def jain_of_shares(got: dict[str, float], demand: dict[str, float]) -> float:
    """Jain's index of each tenant's ``got`` over its max-min fair share of the total
    (NaN when nothing was delivered)."""
    fair = max_min_shares(demand, sum(got.get(t, 0) for t in demand))
    if not all(fair.values()):
        return float("nan")
    return jain([got.get(t, 0) / fair[t] for t in demand])


def queue_line(workdir: Path) -> str:
    """Per tenant, from the EPP's queue-duration histogram: waited/all requests and the mean
    wait (empty for a contender without flow control)."""
    debug = workdir / "debug.json"
    if not debug.exists():
        return ""
    summary = orjson.loads(debug.read_bytes()).get("flowControlQueue") or {}
    return ", ".join(f"{k.split('/', 1)[1]} {v['waited']:.0f}/{v['count']:.0f} "
                     f"({v['mean_wait_s']:.2f} s)" for k, v in sorted(summary.items()))


def quiet_epp_wait(workdir: Path) -> float | None:
    """The quiet tenants' mean wait in the EPP's queues (s; every request, 0 for the ones
    that went at once), from the run's flow-control histogram; None without flow control."""
    debug = workdir / "debug.json"
    if not debug.exists():
        return None
    summary = orjson.loads(debug.read_bytes()).get("flowControlQueue") or {}
    rows = [v for k, v in summary.items() if k.split("/", 1)[1] in QUIET]
    n = sum(v["count"] for v in rows)
    return sum(v["mean_wait_s"] * v["count"] for v in rows) / n if n else None


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
    cpubudget.add_arguments(p)
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    cs = [c for c in contenders()
          if not args.contenders or c.name in args.contenders.split(",")]
    for c in cs:
        c.cpus, c.gateway_cpus = args.router_cpus, args.gateway_cpus
    print(f"CPU budgets: {cpubudget.statement(args)}; burners: {args.burners}", flush=True)
    with cpubudget.burners(args.burners):
        rows = run_seeds(args, seeds, cs)
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    report(seeds, cs, rows)
    return 0


def run_seeds(args: argparse.Namespace, seeds: list[int],
              cs: list[Contender]) -> dict[str, list[dict[str, float]]]:
    """Per contender, one row per seed: the solo and the flooded run's figures."""
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
                              timeout=args.timeout, fleet_cpus=args.fleet_cpus,
                              client_cpus=args.client_cpus)
                specs = w.schedule(1.0, args.duration, seed, args.servers)
                outcomes = [Outcome(**orjson.loads(line)) for line in
                            (workdir / "outcomes.jsonl").read_bytes().splitlines()]
                ttft, done = per_tenant(specs, outcomes, args.time_scale, args.duration)
                queued = queue_line(workdir)
                if queued:
                    print(f"  {w.name} {c.name} queued in the EPP: {queued}", flush=True)
                quiet = [t for q in QUIET for t in ttft.get(q, [])]
                row[f"{w.name}_quiet_p90"] = pct(quiet, 0.9)
                wait = quiet_epp_wait(workdir)
                if wait is not None and quiet:
                    # the rest of their TTFT is spent on the servers (and the wire)
                    row[f"{w.name}_epp_share"] = wait / statistics.fmean(quiet)
                row[f"{w.name}_errors"] = res.errors
                if noisy:
                    got, asked = tokens_within(specs, outcomes, args.time_scale,
                                               args.duration)
                    demand = {t: asked.get(t, 0) for t in (*QUIET, NOISY)}
                    row["jain"] = jain_of_shares(got, demand)
                    # throughput under the flood: every tenant's tokens in the window
                    row["tok_s"] = sum(got.values()) / args.duration
                    row["noisy_goodput_share"] = got.get(NOISY, 0) / max(
                        1e-9, sum(got.values()))
                    # the earlier measure: requests completed within the window
                    row["jain_completed"] = jain_of_shares(
                        {t: float(done.get(t, 0)) for t in demand},
                        {t: float(sum(1 for s in specs if s.tag == t)) for t in demand})
            row["ratio"] = row["noisy_quiet_p90"] / row["quiet_quiet_p90"]
            rows.setdefault(c.name, []).append(row)
            print(f"seed {seed} {c.name}: quiet p90 solo {row['quiet_quiet_p90']:.3f} s, "
                  f"flood {row['noisy_quiet_p90']:.3f} s (x{row['ratio']:.2f}), "
                  f"Jain {row['jain']:.3f} (completed {row['jain_completed']:.3f}), "
                  f"tok/s {row['tok_s']:.0f}, quiet EPP wait / mean TTFT "
                  f"{row.get('noisy_epp_share', float('nan')):.2f}, "
                  f"errors {row['noisy_errors']:.0f}", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(rows, indent=1))
    return rows


def report(seeds: list[int], cs: list[Contender],
           rows: dict[str, list[dict[str, float]]]) -> None:
    print(f"\nnoisy tenant, seeds {seeds}: median [95% bootstrap interval] over seeds")
    base = cs[0].name if cs else ""
    print("| contender | quiet TTFT p90 solo s | with flood s | flood / solo | "
          f"tok/s in window (flood) | tok/s / {base} (paired) | Jain | "
          "quiet EPP wait / mean TTFT (flood) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, rs in rows.items():
        def iv(k: str, rs: list[dict[str, float]] = rs) -> str:
            return str(bootstrap_median([r[k] for r in rs]))
        rel = str(bootstrap_median([r["tok_s"] / b["tok_s"]
                                    for r, b in zip(rs, rows[base], strict=True)]))
        print(f"| {name} | {iv('quiet_quiet_p90')} | {iv('noisy_quiet_p90')} | "
              f"{iv('ratio')} | {iv('tok_s')} | {rel} | {iv('jain')} | "
              f"{spread([r.get('noisy_epp_share', float('nan')) for r in rs])} |")
    print(f"\nnoisy tenant, seeds {seeds}: median [min, max] over seeds")
    print("| contender | quiet TTFT p90 solo s | with flood s | flood / solo | Jain | "
          "noisy share of goodput | Jain (completed) | errors (flood) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, rs in rows.items():
        def col(k: str, rs: list[dict[str, float]] = rs) -> str:
            return spread([r[k] for r in rs])
        print(f"| {name} | {col('quiet_quiet_p90')} | {col('noisy_quiet_p90')} | "
              f"{col('ratio')} | {col('jain')} | {col('noisy_goodput_share')} | "
              f"{col('jain_completed')} | "
              f"{sum(r['noisy_errors'] for r in rs):.0f} |")


if __name__ == "__main__":
    raise SystemExit(main())
