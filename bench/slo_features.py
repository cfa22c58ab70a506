"""Which inputs known at the pick forecast a request's TPOT? A study on the virtual-time twin
(:mod:`bench.slo_twin`), the ShareGPT-like workload at 0.7 of nominal capacity, the default
profile scheduling and ``predicted-latency-producer`` predicting the picked endpoint.

Run: ``python -m bench.slo_features [--seeds 5]`` (a few minutes; results in the "SLO and
session affinity" section of ``bench/RESULTS.md``).

A request's TPOT is set by the prefills other requests bring to its engine while it decodes
(``slo_twin.post_pick_tpot_mape``). Two questions, per seed:

1. How much of that later prefill work (tokens per second on the engine between the
   request's first and last token) is explained, linearly (R²), by everything the EPP knows
   at the pick: the model's inputs, the endpoint's recent dispatch rate (uncached tokens and
   requests over the last 2, 5, 10 s), the request's ``max_tokens``, and the endpoint's
   state relative to the fleet's mean (KV use, tokens in flight, running)?
2. The model's TPOT MAPE after warm-up with each candidate added as an input, the model
   refitted every virtual second on the requests completed so far (``fit_linear``, the
   producer's fit), as the producer does online.
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.slo_twin import PREDICT_ONLY, RETRAIN, SG_CAPACITY, WARMUP, Arrival, Twin, fmt
from bench.slo_twin import sharegpt_like as sharegpt
from epp.latency.predictions import predictions_of
from epp.latency.predictor import TPOT_COLUMNS, fit_linear
from epp.requestcontrol import Routed
from sim.engine import SimRequest

WINDOWS = (2.0, 5.0, 10.0)


@dataclass(slots=True)
class Pick:
    """One request: what was known at its pick and what it measured."""

    at: float
    engine: int
    row: tuple[float, ...]
    max_tokens: int
    #: Uncached tokens sent to the engine over each of ``WINDOWS`` before the pick, per s.
    token_rate: tuple[float, ...]
    request_rate: tuple[float, ...]
    #: The endpoint's KV use, tokens in flight and running minus the fleet's means.
    relative: tuple[float, ...]
    first: float = math.nan
    finish: float = math.nan
    tpot: float | None = None
    out_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class RecordingTwin(Twin):
    """The twin, recording every pick's inputs and every engine's dispatches."""

    def __init__(self, seed: int) -> None:
        super().__init__(PREDICT_ONLY, seed)
        self.picks: dict[int, Pick] = {}
        self.sent: list[list[tuple[float, float]]] = [[] for _ in self.engines]

    def _start(self, a: Arrival, routed: Routed) -> None:
        preds = predictions_of(routed.request)
        assert preds is not None
        i = self.by_key[routed.endpoint.key]
        row = preds.states[routed.endpoint.key]
        rows = list(preds.states.values())
        means = [statistics.fmean(r[c] for r in rows) for c in (5, 6, 4)]
        sent = self.sent[i]
        self.picks[a.seq] = Pick(
            self.now, i, row, int(a.body["max_tokens"]),
            tuple(sum(u for t, u in sent if t > self.now - w) / w for w in WINDOWS),
            tuple(sum(1 for t, _ in sent if t > self.now - w) / w for w in WINDOWS),
            tuple(row[c] - m for c, m in zip((5, 6, 4), means, strict=True)))
        sent.append((self.now, row[1]))
        super()._start(a, routed)

    def _finish(self, routed: Routed, arrival: Arrival, req: SimRequest, t: float) -> None:
        super()._finish(routed, arrival, req, t)
        done, pick = self.done[-1], self.picks[arrival.seq]
        pick.first, pick.finish = done.first_token_at, t
        pick.tpot, pick.out_tokens = done.tpot, done.out_tokens


def record(seed: int, duration: float) -> list[Pick]:
    """One run's completed picks with a TPOT, each with its later prefill rate."""
    twin = RecordingTwin(seed)
    for s in sharegpt(random.Random(seed), 0.7 * SG_CAPACITY, duration):
        twin.add(s.at, s.body)
    twin.run()
    picks = [p for p in twin.picks.values() if p.tpot is not None and p.finish > p.first]
    for p in picks:
        later = sum(n for t, n in twin.prefilled[p.engine] if p.first < t <= p.finish)
        p.extra["later_rate"] = later / (p.finish - p.first)
    return picks


def _token_rate(k: int) -> Callable[[Pick], tuple[float, ...]]:
    return lambda p: (p.token_rate[k],)


CANDIDATES: dict[str, Callable[[Pick], tuple[float, ...]]] = {
    "model inputs only": lambda p: (),
    **{f"+ uncached tokens sent there, last {w:g} s": _token_rate(k)
       for k, w in enumerate(WINDOWS)},
    "+ requests sent there, last 5 s": lambda p: (p.request_rate[1],),
    "+ 1 / max_tokens": lambda p: (1.0 / max(1, p.max_tokens - 1),),
}


def r_squared(picks: list[Pick], x: Callable[[Pick], tuple[float, ...]]) -> float:
    """R² of the later prefill rate on an intercept and ``x`` (least squares)."""
    a = np.array([(1.0, *x(p)) for p in picks])
    y = np.array([p.extra["later_rate"] for p in picks])
    beta, *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(1 - ((a @ beta - y) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def online_mape(picks: list[Pick], extra: Callable[[Pick], tuple[float, ...]]) -> float:
    """TPOT MAPE (%) after warm-up of a model refitted every ``RETRAIN`` s on the requests
    completed so far, inputs = the TPOT model's + ``extra``."""
    def x(p: Pick) -> tuple[float, ...]:
        return (*(p.row[c] for c in TPOT_COLUMNS), *extra(p))

    by_finish = sorted(picks, key=lambda p: p.finish)
    finishes = [p.finish for p in by_finish]
    xs = [x(p) for p in by_finish]
    ys = [p.tpot or 0.0 for p in by_finish]
    tested = by_finish[int(WARMUP * len(by_finish)):]
    models: dict[float, Any] = {}
    errors = []
    for p in tested:
        tick = math.floor(p.at / RETRAIN) * RETRAIN
        if tick not in models:
            n = bisect.bisect_right(finishes, tick)
            models[tick] = fit_linear(xs[:n], ys[:n]) if n >= 20 else None
        model = models[tick]
        if model is not None and p.tpot is not None:
            errors.append(abs(model(x(p)) - p.tpot) / p.tpot)
    return 100 * statistics.fmean(errors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=120.0)
    args = ap.parse_args()
    runs = [record(s, args.duration) for s in range(1, args.seeds + 1)]

    def everything(p: Pick) -> tuple[float, ...]:
        return (*p.row, *p.token_rate, *p.request_rate, 1.0 / max(1, p.max_tokens - 1),
                math.log(p.max_tokens), *p.relative)

    def correlation(picks: list[Pick]) -> float:
        return float(np.corrcoef([p.extra["later_rate"] for p in picks],
                                 [p.tpot or 0.0 for p in picks])[0, 1])

    print(f"| correlation of the later prefill rate with TPOT | "
          f"{fmt([correlation(r) for r in runs], 2)} |")
    print(f"| R² of the later prefill rate, from every pick-time input | "
          f"{fmt([r_squared(r, everything) for r in runs], 3)} |")
    print(f"| R² from the endpoint's state relative to the fleet alone | "
          f"{fmt([r_squared(r, lambda p: p.relative) for r in runs], 3)} |")
    for name, extra in CANDIDATES.items():
        print(f"| TPOT MAPE, {name} | {fmt([online_mape(r, extra) for r in runs], 1)} % |",
              flush=True)


if __name__ == "__main__":
    main()
