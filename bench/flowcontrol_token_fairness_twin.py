"""Token fairness in virtual time (issue #27's "Token fairness" figure, twin form): three
tenants, all backlogged, one sending 10x longer prompts, through the real EPP runtime and
flow controller (:class:`bench.twin.runtime.Twin` on :mod:`bench.twin.vtime`'s clock) in front
of 8 simulated ``8b-h100`` engines.

    python -m bench.flowcontrol_token_fairness_twin                 # seeds 0-9
    python -m bench.flowcontrol_token_fairness_twin --seeds 10,11,12,13,14

Each tenant sends ShareGPT-like requests at 0.6x the fleet's nominal request capacity (1.8x
in all, so every tenant has requests waiting throughout); ``long``'s prompts are 10x as long.
The first arrivals find the pool empty and go at once, without the fairness policy (the
flow controller's fast path, as upstream), so the figures are over the window
[``WARMUP``, ``DURATION``] = [30 s, 60 s], once every tenant is backlogged and the policy has
settled the start.
Both configs dispatch on ``concurrency-detector`` (8 in flight per engine) and differ only
in the band's fairness policy: ``round-robin-fairness-policy`` (request-count fairness) or
``token-fairness-policy`` (weighted tokens served). Reported per config, median over seeds
[95% bootstrap interval of the median]:

- each tenant's share of the tokens served in the window (prompt tokens when its first
  token came, output tokens spread evenly from first to last), and the same in the
  policy's weighted tokens (output x2, as the policy counts them);
- Jain's index over the three shares (1 = equal).
"""

from __future__ import annotations

import argparse
import random
from dataclasses import replace

from bench.scenario import SCENARIOS
from bench.stats import bootstrap_median
from bench.twin.runtime import Twin
from bench.twin.vtime import run_in_virtual_time
from bench.workloads import (
    FAIRNESS_HEADER,
    FLEET_SIZE,
    WORKLOADS,
    RequestSpec,
    lengths,
    poisson_arrivals,
)
from epp.requestcontrol import Routed
from sim.engine import SimRequest

DURATION = 60.0
WARMUP = 30.0
LOAD = 0.6
TENANTS = ("long", "a", "b")
LONG_FACTOR = 10
SHAREGPT = WORKLOADS["sharegpt"]
CONFIGS = {"round-robin": (SCENARIOS / "configs" / "flowcontrol-fair-c8.yaml").read_text(),
           "token": (SCENARIOS / "configs" / "flowcontrol-token-c8.yaml").read_text()}


class TokenTwin(Twin):
    """A :class:`Twin` that keeps each finished request's tokens and times."""

    def __init__(self, config: str | None, seed: int, fleet: int) -> None:
        super().__init__(config, seed, fleet)
        #: (tenant, first token time, finish time, prompt tokens, output tokens)
        self.served: list[tuple[str, float, float, int, int]] = []

    def _finish(self, routed: Routed, arrival: object, req: SimRequest, t: float) -> None:
        super()._finish(routed, arrival, req, t)  # type: ignore[arg-type]
        first = req.first_token_time if req.first_token_time is not None else t
        self.served.append((arrival.tag, first, t,  # type: ignore[attr-defined]
                            req.prompt_tokens, req.generated))


def schedule(seed: int, servers: int) -> list[RequestSpec]:
    rng = random.Random(f"token-fairness:{seed}")
    rate = LOAD * SHAREGPT.capacity(servers)
    p = dict(SHAREGPT.parameters)
    specs: list[RequestSpec] = []
    for tenant in TENANTS:
        params = p
        if tenant == "long":
            params = {**p, "input_median": p["input_median"] * LONG_FACTOR,
                      "input_min": p["input_min"] * LONG_FACTOR,
                      "input_max": p["input_max"] * LONG_FACTOR}
        times = poisson_arrivals(rng, rate, max(1, round(rate * DURATION)))
        specs += [replace(s, tag=tenant, headers={FAIRNESS_HEADER: tenant})
                  for s in lengths(rng, params, times)]
    return sorted(specs, key=lambda s: s.at)


def shares(served: list[tuple[str, float, float, int, int]],
           output_weight: float) -> dict[str, float]:
    """Per tenant, its share of the tokens served by the end of the window."""
    got = dict.fromkeys(TENANTS, 0.0)
    for tenant, first, finish, prompt, out in served:
        if first > DURATION or finish < WARMUP:
            continue
        if first >= WARMUP:
            got[tenant] += prompt
        # output tokens spread evenly over [first, finish]; the part inside the window
        span = max(finish - first, 1e-9)
        inside = max(0.0, min(finish, DURATION) - max(first, WARMUP)) / span
        got[tenant] += output_weight * out * (1.0 if span <= 1e-9 else inside)
    total = sum(got.values()) or 1.0
    return {t: v / total for t, v in got.items()}


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


def run(config: str, seed: int, servers: int) -> dict[str, float]:
    twin = TokenTwin(CONFIGS[config], seed, servers)
    for s in schedule(seed, servers):
        twin.add(s.at, s.body, dict(s.headers), s.tag)
    run_in_virtual_time(twin.run_async())
    out: dict[str, float] = {}
    for label, weight in (("raw", 1.0), ("weighted", 2.0)):
        sh = shares(twin.served, weight)
        for t in TENANTS:
            out[f"{label}:{t}"] = sh[t]
        out[f"{label}:jain"] = jain(list(sh.values()))
    return out


def spread(xs: list[float]) -> str:
    iv = bootstrap_median(xs)
    return f"{iv.median:.3f} [{iv.lo:.3f}, {iv.hi:.3f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="round-robin,token")
    p.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    p.add_argument("--servers", type=int, default=FLEET_SIZE)
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    for config in args.configs.split(","):
        runs = [run(config, seed, args.servers) for seed in seeds]
        print(f"## {config} ({len(seeds)} seeds)")
        for key in runs[0]:
            print(f"  {key:<16} {spread([r[key] for r in runs])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
