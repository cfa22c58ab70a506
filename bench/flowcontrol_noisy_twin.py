"""The noisy-tenant benchmark (``bench.flowcontrol_noisy``) in virtual time: the real EPP
runtime and flow controller (:class:`bench.slo_twin.Twin`, on :mod:`bench.twin.vtime`'s
clock) in front of the benchmark's fleet (8 simulated ``8b-h100`` engines), no Envoy, load
generator or CPU contention, so no lock is needed and a sweep takes a minute or two.

    python -m bench.flowcontrol_noisy_twin                      # the configs below, 10 seeds
    python -m bench.flowcontrol_noisy_twin --configs c8,c6 --seeds 0,1,2
    python -m bench.flowcontrol_noisy_twin --configs c8,least-c8,least-c8-p1,least-c12-p1

Config names: ``cN`` = ``concurrency-detector`` ``maxConcurrency: N`` + round-robin fairness,
``least-cN`` with ``least-inflight-fairness-policy``, ``-pK`` adds ``maxPrefillConcurrency:
K``, ``tN`` counts tokens, ``least-c8-reserve0.75`` puts the noisy tenant in a capped
sheddable band.

Same schedules as the real bench (three quiet tenants at 0.1x capacity each, a noisy one at
1.0x, each naming itself in ``x-gateway-inference-fairness-id``; 20 model s of arrivals).
Per config and seed, a solo run (quiet tenants alone) and a flood run. Reported, median
over seeds [95% bootstrap interval of the median]:

- the quiet tenants' TTFT p90 solo, under the flood, and flood / solo;
- where their time went under the flood, for the requests at or above their p90: waiting in
  the EPP (arrival to dispatch), in the engine's queue (dispatch to first scheduled) and in
  their prefill steps (first scheduled to first token), each as a share of their TTFT;
- the output tokens per second the fleet delivered within the 20 s window under the flood
  (all tenants; tokens between a request's first and last are spread evenly over that
  span), and per config relative to the first config listed (the throughput cost);
- Jain's index of per-tenant goodput over max-min fair shares, as in the real bench.

The real bench (``bench.flowcontrol_noisy``) measures the chosen configs through Envoy; this
model chooses which ones to measure.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, replace

from bench.flowcontrol_noisy import (
    NOISY,
    QUIET,
    TenantMix,
    concurrency_config,
    jain_of_shares,
    token_concurrency_config,
    tokens_asked,
)
from bench.slo_twin import Twin
from bench.stats import bootstrap_median
from bench.twin.vtime import run_in_virtual_time
from bench.workloads import FLEET_SIZE
from devkit.stats import percentile as pct
from epp.requestcontrol import Routed
from sim.engine import SimRequest

DURATION = 20.0


@dataclass(frozen=True, slots=True)
class Served:
    """One completed request's timeline (model seconds)."""

    tag: str
    arrival: float
    dispatched: float
    scheduled: float
    first_token: float
    finish: float
    tokens: int


class TimedTwin(Twin):
    """A :class:`Twin` that keeps each request's dispatch and engine times."""

    def __init__(self, config: str | None, seed: int, fleet: int) -> None:
        super().__init__(config, seed, fleet)
        self.served: list[Served] = []

    def _finish(self, routed: Routed, arrival: object, req: SimRequest, t: float) -> None:
        super()._finish(routed, arrival, req, t)  # type: ignore[arg-type]
        at = arrival.at  # type: ignore[attr-defined]
        self.served.append(Served(
            arrival.tag, at, req.arrival,  # type: ignore[attr-defined]
            req.first_scheduled if req.first_scheduled is not None else req.arrival,
            req.first_token_time if req.first_token_time is not None else t, t,
            req.generated))


def tokens_by(served: list[Served], window: float) -> dict[str, float]:
    """Per tenant, output tokens delivered by ``window`` (even spacing first..last)."""
    got: dict[str, float] = {}
    for s in served:
        if s.first_token > window or s.tokens <= 0:
            continue
        if s.tokens == 1 or s.finish <= window:
            n = float(s.tokens)
        else:
            n = 1 + (s.tokens - 1) * (window - s.first_token) / (s.finish - s.first_token)
        got[s.tag] = got.get(s.tag, 0.0) + n
    return got


def run(config: str, seed: int, noisy: bool, servers: int,
        noisy_headers: dict[str, str] | None = None) -> dict[str, float]:
    """One run; figures for the quiet tenants, and throughput and Jain under the flood.
    ``noisy_headers`` are added to the noisy tenant's requests."""
    mix = TenantMix("noisy" if noisy else "quiet", noisy)
    specs = mix.schedule(1.0, DURATION, seed, servers)
    if noisy_headers:
        specs = [replace(s, headers={**s.headers, **noisy_headers}) if s.tag == NOISY else s
                 for s in specs]
    twin = TimedTwin(config, seed, servers)
    for s in specs:
        twin.add(s.at, s.body, dict(s.headers), s.tag)
    run_in_virtual_time(twin.run_async())
    quiet = [s for s in twin.served if s.tag in QUIET]
    ttft = [s.first_token - s.arrival for s in quiet]
    p90 = pct(ttft, 0.9)
    out = {"p90": p90, "refused": float(twin.refused)}
    tail = [s for s in quiet if s.first_token - s.arrival >= p90] or quiet
    total = sum(s.first_token - s.arrival for s in tail) or 1.0
    out["epp"] = sum(s.dispatched - s.arrival for s in tail) / total
    out["engine_queue"] = sum(s.scheduled - s.dispatched for s in tail) / total
    out["prefill"] = sum(s.first_token - s.scheduled for s in tail) / total
    out["epp_mean_s"] = statistics.fmean(s.dispatched - s.arrival for s in quiet)
    if noisy:
        got = tokens_by(twin.served, DURATION)
        out["tok_s"] = sum(got.values()) / DURATION
        asked = tokens_asked(specs, DURATION)
        out["jain"] = jain_of_shares(got, {t: asked.get(t, 0) for t in (*QUIET, NOISY)})
        noisy_done = [s for s in twin.served if s.tag == NOISY]
        out["noisy_inflight"] = 0.0
        if noisy_done:
            # time-average noisy requests on the engines over the window, per server
            busy = sum(max(0.0, min(s.finish, DURATION) - min(s.dispatched, DURATION))
                       for s in noisy_done)
            out["noisy_inflight"] = busy / DURATION / servers
    return out


def reserve_config(max_concurrency: int, ceiling: float) -> str:
    """``least-c<N>`` with ``priority-usage-limit-policy``: the sheddable band (priority -1)
    dispatches only while the pool's saturation is below ``ceiling``."""
    return concurrency_config(max_concurrency, "least-inflight-fairness-policy").replace(
        "plugins:\n", "plugins:\n- type: priority-usage-limit-policy\n  parameters: "
        f"{{bands: [{{priority: -1, threshold: {ceiling}}}]}}\n", 1).replace(
        "flowControl:\n", "flowControl:\n  usageLimitPolicyPluginRef: "
        "priority-usage-limit-policy\n", 1)


CONFIGS = {
    **{f"c{n}": concurrency_config(n) for n in (4, 5, 6, 7, 8, 10)},
    **{f"least-c{n}": concurrency_config(n, "least-inflight-fairness-policy")
       for n in (6, 7, 8, 10, 12)},
    **{f"t{n}": token_concurrency_config(n) for n in (4000, 6000, 8000)},
    # maxPrefillConcurrency k (ours): at most k requests per server awaiting a first token
    **{f"least-c{n}-p{k}": concurrency_config(n, "least-inflight-fairness-policy", k)
       for n in (8, 10, 12, 16, 64) for k in (1, 2)},
    **{f"c{n}-p1": concurrency_config(n, max_prefill=1) for n in (8, 12)},
    # the operator names the noisy tenant: its requests in the sheddable band (priority -1),
    # which dispatches only below 0.75 saturation (priority-usage-limit-policy)
    "least-c8-reserve0.75": reserve_config(8, 0.75),
}
#: Headers the noisy tenant's requests carry, per config (default none).
NOISY_HEADERS = {"least-c8-reserve0.75": {"x-gateway-inference-objective": "sheddable"}}


def spread(xs: list[float], digits: int = 2) -> str:
    """Median [95% bootstrap interval of the median] over seeds."""
    xs = [x for x in xs if x == x]
    if not xs:
        return "n/a"
    iv = bootstrap_median(xs)
    return f"{iv.median:.{digits}f} [{iv.lo:.{digits}f}, {iv.hi:.{digits}f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="c8,c7,c6,c5,c4,t8000,t6000,t4000",
                   help=f"comma-separated, first = the baseline; known: {', '.join(CONFIGS)}")
    p.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    p.add_argument("--servers", type=int, default=FLEET_SIZE)
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"unknown config(s): {', '.join(unknown)}")
    base_tok: dict[int, float] = {}
    print(f"noisy tenant in virtual time, {args.servers} servers, seeds {seeds}; "
          "median [95% bootstrap interval] over seeds")
    print("| config | quiet p90 solo s | flood s | flood / solo | p90 tail: EPP / engine "
          "queue / prefill | quiet mean EPP wait s | noisy in flight per server | "
          "tok/s in window | tok/s / first | Jain |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for name in names:
        rows = []
        for seed in seeds:
            solo = run(CONFIGS[name], seed, False, args.servers)
            flood = run(CONFIGS[name], seed, True, args.servers, NOISY_HEADERS.get(name))
            if name == names[0]:
                base_tok[seed] = flood["tok_s"]
            rows.append({"solo": solo["p90"], "flood": flood["p90"],
                         "ratio": flood["p90"] / solo["p90"],
                         "epp": flood["epp"], "queue": flood["engine_queue"],
                         "prefill": flood["prefill"], "epp_mean": flood["epp_mean_s"],
                         "inflight": flood["noisy_inflight"], "tok": flood["tok_s"],
                         "tok_rel": flood["tok_s"] / base_tok[seed], "jain": flood["jain"],
                         "refused": solo["refused"] + flood["refused"]})

        def col(k: str, digits: int = 2, rows: list[dict[str, float]] = rows) -> str:
            return spread([r[k] for r in rows], digits)
        tail = " / ".join(f"{statistics.median(r[k] for r in rows):.2f}"
                          for k in ("epp", "queue", "prefill"))
        print(f"| {name} | {col('solo')} | {col('flood')} | {col('ratio')} | {tail} | "
              f"{col('epp_mean', 3)} | {col('inflight', 1)} | {col('tok', 0)} | "
              f"{col('tok_rel')} | {col('jain')} |", flush=True)
        refused = sum(r["refused"] for r in rows)
        if refused:
            print(f"  ({name}: {refused:.0f} requests refused)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
