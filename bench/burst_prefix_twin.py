"""Does ``burst-prefix-cache-producer`` do what llm-d-router v0.10 says it does? In the
virtual-time twin, a workload built for it: RL-rollout steps, each a burst of 4 prompts x 8
samples (32 requests within 50 ms) sharing a 3,000-token prompt per group, 64 output tokens,
one step every 4 s, on 4 servers with cold caches for every new step's prompts. Upstream's
claim: co-locating the samples of a prompt prefills the shared prompt once instead of on
every replica the load balancer scatters them to.

Three configs: ``load`` (``queue-scorer`` + ``max-score-picker``: what a cache-state scorer
degenerates to while every cache is cold and its events lag, upstream's problem statement),
``approx`` (``approx-prefix-cache-producer`` + ``prefix-cache-scorer`` (weight 2) + the
same; this EPP's approximate producer records each pick at once, so simultaneous samples
already see their predecessors), and ``burst`` (``burst-prefix-cache-producer``,
``windowDurationMs: 100``, as the scorer's producer instead).
The twin holds each request until its window closes (virtual time, so the wait counts in
TTFT), then places the window as the plugin does. Per seed: prompt tokens computed (not
served from cache), mean TTFT, mean step makespan; the with/without ratios' medians over
seeds with a bootstrap 95% interval.

    python -m bench.burst_prefix_twin --seeds 8
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from bench.no_hit_lru_twin import words
from bench.stats import bootstrap_median
from bench.twin.epp_adapter import EppRouter, Refused
from bench.twin.loop import TwinConfig, run
from bench.workloads import MODEL, RequestSpec
from epp.requestcontrol.director import DESTINATION, Pending
from epp.requestcontrol.plugins.burst_prefix_cache_producer import BurstPrefixCacheProducer
from shared.errors import GatewayError

WITHOUT = """\
plugins:
- {type: approx-prefix-cache-producer}
- {type: prefix-cache-scorer}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
"""
LOAD = """\
plugins:
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
"""
WITH = WITHOUT.replace("- {type: approx-prefix-cache-producer}",
                       "- {type: burst-prefix-cache-producer, parameters: "
                       "{windowDurationMs: 100, blockSizeTokens: 16}}")
GROUPS, SAMPLES, PROMPT, STEP = 4, 8, 3000, 4.0


def schedule(seed: int, steps: int) -> list[RequestSpec]:
    """``steps`` rollout steps: GROUPS new prompts x SAMPLES samples, within 50 ms."""
    rng = random.Random(seed)
    out = []
    for step in range(steps):
        prompts = [words(rng, PROMPT) for _ in range(GROUPS)]
        for g, prompt in enumerate(prompts):
            for _ in range(SAMPLES):
                at = step * STEP + rng.uniform(0, 0.05)
                out.append(RequestSpec(at, "/v1/completions", {
                    "model": MODEL, "prompt": prompt, "max_tokens": 64, "stream": True},
                    tag=f"{step}-{g}"))
    out.sort(key=lambda s: s.at)
    return out


class WindowedRouter(EppRouter):
    """The EPP with a burst producer in virtual time: a request's pick waits for the end of
    its window (``pick_done``); the window's requests are then placed together."""

    def __init__(self, *args: Any, specs: list[RequestSpec], **kw: Any) -> None:
        super().__init__(*args, **kw)
        (self.burst,) = self.director.runtime.handle.find(BurstPrefixCacheProducer)
        self.specs = specs
        self.window_s = self.burst.params.window_duration_ms / 1000.0
        self.window_end: dict[int, float] = {}
        self.members: dict[float, list[int]] = defaultdict(list)
        self.ready: dict[int, Pending] = {}
        end = -1.0
        for i, s in enumerate(specs):  # windows open at the first arrival after the last
            if s.at >= end:
                end = s.at + self.window_s
            self.window_end[i] = end
            self.members[end].append(i)

    def pick_done(self, index: int, arrival: float) -> float:
        return self.window_end[index]

    def route(self, index: int, path: str, body: bytes, now: float,
              headers: Mapping[str, str]) -> str:
        if index not in self.ready:
            self._place(self.members[self.window_end[index]])
        pending = self.ready.pop(index)
        try:
            decision, routed = self.director.dispatch(pending)
        except GatewayError as e:
            raise Refused(e.status, str(e)) from None
        self._routed[index] = routed
        return decision.set_headers[DESTINATION]

    def _place(self, indexes: list[int]) -> None:
        import orjson

        pendings = {}
        for i in indexes:
            spec = self.specs[i]
            headers = {**spec.headers, ":path": spec.path, ":method": "POST",
                       "content-type": "application/json", "x-request-id": f"twin-{i}"}
            pendings[i] = self.director.prepare(headers, orjson.dumps(spec.body), {})

        async def window() -> None:
            waits = [self.burst.admit(p.request, p.candidates) for p in pendings.values()]
            window = self.burst._window
            if window is not None:
                self.burst._seal(window)  # virtual time: the window is over now
            await asyncio.gather(*(w for w in waits if w is not None))

        asyncio.run(window())
        self.ready.update(pendings)


def measure(config: str, seed: int, steps: int) -> dict[str, float]:
    specs = schedule(seed, steps)
    cfg = TwinConfig(servers=4, seed=seed, model=MODEL)
    text = {"load": LOAD, "approx": WITHOUT, "burst": WITH}[config]
    router: EppRouter = (WindowedRouter(f"epp-{config}", cfg.keys(), seed, config_text=text,
                                        model=MODEL, specs=specs) if config == "burst" else
                         EppRouter(f"epp-{config}", cfg.keys(), seed, config_text=text,
                                   model=MODEL))
    outcomes = run(specs, router, cfg)
    computed = sum(o.prompt_tokens - o.cached_tokens for o in outcomes if o.ok)
    ttft = statistics.fmean(o.ttft or 0.0 for o in outcomes if o.ok)
    ends: dict[int, float] = defaultdict(float)
    for s, o in zip(specs, outcomes, strict=True):
        step = int(s.tag.split("-")[0])
        if o.ok and o.e2e is not None:
            ends[step] = max(ends[step], s.at + o.e2e - step * STEP)
    return {"computed": float(computed), "ttft": ttft, "makespan": statistics.fmean(
        ends.values()), "ok": sum(o.ok for o in outcomes) / len(outcomes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    names = ("load", "approx", "burst")
    rows: dict[str, dict[int, dict[str, float]]] = {n: {} for n in names}
    for seed in range(a.seeds):
        for n in names:
            rows[n][seed] = measure(n, seed, a.steps)
        print(f"seed {seed}: " + "; ".join(
            f"{n}: computed {rows[n][seed]['computed']:.0f}, TTFT {rows[n][seed]['ttft']:.3f} s"
            f", makespan {rows[n][seed]['makespan']:.2f} s, ok {rows[n][seed]['ok']:.3f}"
            for n in names), flush=True)
    for base in ("load", "approx"):
        for metric in ("computed", "ttft", "makespan"):
            ratios = [rows["burst"][s][metric] / rows[base][s][metric]
                      for s in range(a.seeds) if rows[base][s][metric] > 0]
            print(f"{metric} burst/{base}: {bootstrap_median(ratios)} over {len(ratios)} seeds")


if __name__ == "__main__":
    main()
