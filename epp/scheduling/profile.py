"""A scheduling profile: filters, then weighted scorers, then a picker."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter, Picker, SchedulerHooks, Scorer
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import ProfileResult


@dataclass(slots=True)
class WeightedScorer:
    """A scorer and its weight in the profile's total."""

    scorer: Scorer
    weight: float


@dataclass(slots=True)
class SchedulingProfile:
    """Filters → weighted scorers → picker.

    total(endpoint) = sum over scorers of clamp(score, 0, 1) * weight; the picker chooses on
    the totals. A filter that empties the set ends the profile with no pick.
    """

    name: str
    picker: Picker
    filters: list[Filter] = field(default_factory=list)
    scorers: list[WeightedScorer] = field(default_factory=list)

    def run(
        self,
        request: LLMRequest,
        endpoints: Sequence[EndpointView],
        rng: random.Random,
        hooks: SchedulerHooks,
    ) -> ProfileResult:
        """Run the profile over ``endpoints``."""
        timer = hooks.plugin_duration
        cands = endpoints
        for f in self.filters:
            t0 = perf_counter() if timer else 0.0
            cands = f.filter(request, cands)
            if timer:
                timer("filter", f.type_name, f.name, perf_counter() - t0)
            if not cands:
                return ProfileResult(self.name, [], rejected_by=f.name)
        totals: list[float] = [0.0] * len(cands)
        for ws in self.scorers:
            scorer, w = ws.scorer, ws.weight
            t0 = perf_counter() if timer else 0.0
            scores = scorer.score(request, cands)
            if scorer.bounded:
                totals = [t + s * w for t, s in zip(totals, scores, strict=True)]
            else:
                # Written so NaN lands on 0: a broken third-party score never wins a pick.
                totals = [
                    t + ((s * w if s < 1.0 else w) if s > 0.0 else 0.0)
                    for t, s in zip(totals, scores, strict=True)
                ]
            if timer:
                timer("scorer", scorer.type_name, scorer.name, perf_counter() - t0)
        t0 = perf_counter() if timer else 0.0
        picked = self.picker.pick(request, cands, totals, rng)
        if timer:
            timer("picker", self.picker.type_name, self.picker.name, perf_counter() - t0)
        return ProfileResult(self.name, picked, cands, totals)
