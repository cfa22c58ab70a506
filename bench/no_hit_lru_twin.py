"""Does ``no-hit-lru-scorer`` do what llm-d-router v0.10 says it does? In the virtual-time
twin (real EPP plugins, the simulator's engine model), a workload built for it: half the
requests are *cold* (a prompt no server has seen), half are *warm* (one of 8 long system
prompts + a question). Upstream's claim: ranking pods least-recently-used for cold requests
"evenly distributes cache growth across pods" (warm requests keep their cache locality).

Two configs, upstream's README example without and with the scorer:
``prefix-cache-scorer`` (weight 10) + ``max-score-picker`` [+ ``no-hit-lru-scorer`` (5)].
Per seed: the spread of cold prompt tokens over the pods (coefficient of variation: std /
mean; 0 = perfectly even), the warm requests' cache hit share and TTFT. The with/without
ratios' medians over seeds come with a bootstrap 95% interval.

    python -m bench.no_hit_lru_twin --seeds 8
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import defaultdict

from bench.stats import bootstrap_median
from bench.twin.epp_adapter import EppRouter
from bench.twin.loop import TwinConfig, run
from bench.workloads import MODEL, RequestSpec, poisson_arrivals

BASE = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: prefix-cache-scorer, name: cache-scorer}
- {type: max-score-picker}
%s
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: cache-scorer, weight: 10}
  - {pluginRef: max-score-picker}
%s
"""
WITHOUT = BASE % ("", "")
WITH = BASE % ("- {type: no-hit-lru-scorer, name: lru-scorer, parameters: "
               "{prefixPluginName: cache-scorer}}",
               "  - {pluginRef: lru-scorer, weight: 5}")


def words(rng: random.Random, tokens: int) -> str:
    """Random 4-byte words (one simulator token each): prompts never share by accident."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(rng.choice(letters) + rng.choice(letters) + rng.choice(letters) + " "
                   for _ in range(tokens))


def schedule(seed: int, rate: float, duration: float) -> list[RequestSpec]:
    """Half cold (unique 1,500-token prompts), half warm (8 groups: 3,000-token system prompt
    + 100-token question); 64 output tokens each."""
    rng = random.Random(seed)
    systems = [words(rng, 3000) for _ in range(8)]
    times = poisson_arrivals(rng, rate, int(rate * duration))
    out = []
    for at in times:
        if rng.random() < 0.5:
            prompt, tag = words(rng, 1500), "cold"
        else:
            g = rng.randrange(8)
            prompt, tag = systems[g] + words(rng, 100), f"warm-{g}"
        out.append(RequestSpec(at, "/v1/completions", {
            "model": MODEL, "prompt": prompt, "max_tokens": 64, "stream": True}, tag=tag))
    return out


def measure(config: str, name: str, seed: int, servers: int, rate: float,
            duration: float) -> dict[str, float]:
    """One twin run: cold-token spread (CV), warm cached share, mean TTFT (seconds)."""
    specs = schedule(seed, rate, duration)
    cfg = TwinConfig(servers=servers, seed=seed, model=MODEL)
    outcomes = run(specs, EppRouter(name, cfg.keys(), seed, config_text=config, model=MODEL),
                   cfg)
    cold: dict[str, float] = defaultdict(float, dict.fromkeys(cfg.keys(), 0.0))
    warm_prompt = warm_cached = 0
    ttfts = []
    for spec, o in zip(specs, outcomes, strict=True):
        if not o.ok:
            continue
        ttfts.append(o.ttft or 0.0)
        if spec.tag == "cold":
            cold[o.pod] += o.prompt_tokens
        else:
            warm_prompt += o.prompt_tokens
            warm_cached += o.cached_tokens
    loads = list(cold.values())
    mean = statistics.fmean(loads)
    return {"cold_cv": statistics.pstdev(loads) / mean if mean else 0.0,
            "warm_hit": warm_cached / warm_prompt if warm_prompt else 0.0,
            "ttft": statistics.fmean(ttfts) if ttfts else 0.0,
            "ok": len(ttfts) / len(specs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=6.0, help="requests per model second")
    ap.add_argument("--duration", type=float, default=60.0, help="model seconds per run")
    a = ap.parse_args()
    rows: dict[str, dict[int, dict[str, float]]] = {"without": {}, "with": {}}
    for seed in range(a.seeds):
        for name, config in (("without", WITHOUT), ("with", WITH)):
            rows[name][seed] = measure(config, f"epp-{name}-lru", seed, a.servers, a.rate,
                                       a.duration)
        w, o = rows["with"][seed], rows["without"][seed]
        print(f"seed {seed}: cold CV {o['cold_cv']:.3f} -> {w['cold_cv']:.3f}, warm hit "
              f"{o['warm_hit']:.3f} -> {w['warm_hit']:.3f}, TTFT {o['ttft']:.3f} -> "
              f"{w['ttft']:.3f} s, ok {o['ok']:.3f} / {w['ok']:.3f}", flush=True)
    for metric in ("cold_cv", "warm_hit", "ttft"):
        ratios = [rows["with"][s][metric] / rows["without"][s][metric]
                  for s in range(a.seeds) if rows["without"][s][metric] > 0]
        print(f"{metric} with/without: {bootstrap_median(ratios)} over {len(ratios)} seeds")


if __name__ == "__main__":
    main()
