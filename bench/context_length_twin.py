"""Does ``context-length-aware`` do what llm-d-router v0.10 says it does? In the virtual-time
twin, a workload of mixed context lengths: 80% short prompts (300 tokens), 20% long ones
(7,000 tokens), 64 output tokens each, on 4 identical servers, one labelled for short
contexts (``llm-d.ai/context-length-range: 0-2048``) and three for long ones (``2049-32768``):
capacity in proportion to the prompt tokens each class brings (20% x 7,000 against 80% x 300).
Upstream's claim: matching requests to pods configured for their context length optimizes
performance; on identical hardware the measurable part is that short requests stop queueing
behind long prefills.

Two configs: a load-balancing base (``queue-scorer`` + ``kv-cache-utilization-scorer`` +
``max-score-picker``) without and with ``context-length-aware`` (weight 8, upstream's
example). Per seed: mean and p90 TTFT of the short and of the long requests; the with/without
ratios' medians over seeds with a bootstrap 95% interval.

    python -m bench.context_length_twin --seeds 8
"""

from __future__ import annotations

import argparse
import random
import statistics

from bench.no_hit_lru_twin import words
from bench.stats import bootstrap_median, quantile
from bench.twin.epp_adapter import EppRouter
from bench.twin.loop import TwinConfig, run
from bench.workloads import MODEL, RequestSpec, poisson_arrivals

BASE = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: max-score-picker}
%s
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer}
  - {pluginRef: kv-cache-utilization-scorer}
  - {pluginRef: max-score-picker}
%s
"""
WITHOUT = BASE % ("", "")
WITH = BASE % ("- {type: context-length-aware, name: context-router}",
               "  - {pluginRef: context-router, weight: 8}")
LABEL = "llm-d.ai/context-length-range"


def schedule(seed: int, rate: float, duration: float) -> list[RequestSpec]:
    """80% short (300-token) and 20% long (7,000-token) prompts, Poisson arrivals."""
    rng = random.Random(seed)
    out = []
    for at in poisson_arrivals(rng, rate, int(rate * duration)):
        long_ = rng.random() < 0.2
        prompt = words(rng, 7000 if long_ else 300)
        out.append(RequestSpec(at, "/v1/completions", {
            "model": MODEL, "prompt": prompt, "max_tokens": 64, "stream": True},
            tag="long" if long_ else "short"))
    return out


def measure(config: str, name: str, seed: int, rate: float,
            duration: float) -> dict[str, float]:
    """One twin run: TTFT mean and p90 (seconds) of short and long requests."""
    specs = schedule(seed, rate, duration)
    cfg = TwinConfig(servers=4, seed=seed, model=MODEL)
    keys = cfg.keys()
    labels = {k: {LABEL: "0-2048" if i < 1 else "2049-32768"} for i, k in enumerate(keys)}
    outcomes = run(specs, EppRouter(name, keys, seed, config_text=config, model=MODEL,
                                    labels=labels), cfg)
    by: dict[str, list[float]] = {"short": [], "long": []}
    for spec, o in zip(specs, outcomes, strict=True):
        if o.ok and o.ttft is not None:
            by[spec.tag].append(o.ttft)
    return {"short_mean": statistics.fmean(by["short"]),
            "short_p90": quantile(by["short"], 0.9),
            "long_mean": statistics.fmean(by["long"]),
            "ok": (len(by["short"]) + len(by["long"])) / len(specs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--rate", type=float, default=8.0, help="requests per model second")
    ap.add_argument("--duration", type=float, default=60.0, help="model seconds per run")
    a = ap.parse_args()
    rows: dict[str, dict[int, dict[str, float]]] = {"without": {}, "with": {}}
    for seed in range(a.seeds):
        for name, config in (("without", WITHOUT), ("with", WITH)):
            rows[name][seed] = measure(config, f"epp-{name}-cla", seed, a.rate, a.duration)
        w, o = rows["with"][seed], rows["without"][seed]
        print(f"seed {seed}: short TTFT {o['short_mean']:.3f} -> {w['short_mean']:.3f} s "
              f"(p90 {o['short_p90']:.3f} -> {w['short_p90']:.3f}), long TTFT "
              f"{o['long_mean']:.3f} -> {w['long_mean']:.3f} s, ok {o['ok']:.3f} / "
              f"{w['ok']:.3f}", flush=True)
    for metric in ("short_mean", "short_p90", "long_mean"):
        ratios = [rows["with"][s][metric] / rows["without"][s][metric]
                  for s in range(a.seeds) if rows["without"][s][metric] > 0]
        print(f"{metric} with/without: {bootstrap_median(ratios)} over {len(ratios)} seeds")


if __name__ == "__main__":
    main()
