"""A scheduling profile: filters, then weighted scorers, then a picker."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter, Picker, SchedulerHooks, Scorer
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import ProfileResult

if TYPE_CHECKING:
    from shared.tracing import ChildSpan as Span
    from shared.tracing import RequestTrace

#: Per-endpoint values a plugin span carries at most (parallel arrays: bounded attributes,
#: no per-endpoint attribute keys).
TRACED_ENDPOINTS = 16


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
        span: Span | None = None,
    ) -> ProfileResult:
        """Run the profile over ``endpoints``. With ``span`` (the profile's span of a sampled
        request, see :class:`epp.scheduling.scheduler.Scheduler`) each filter, scorer and the
        picker get a child span; without, no tracing work at all."""
        timer = hooks.plugin_duration
        trace = request.trace if span is not None else None
        cands = endpoints
        for f in self.filters:
            pspan = _start(trace, span, "filter", f, cands) if trace is not None else None
            t0 = perf_counter() if timer else 0.0
            cands = f.filter(request, cands)
            if timer:
                timer("filter", f.type_name, f.name, perf_counter() - t0)
            if pspan is not None:
                pspan.set_attribute("llm_d.epp.filter.filtered_endpoints", len(cands))
                pspan.end()
            if not cands:
                return ProfileResult(self.name, [], rejected_by=f.name)
        totals: list[float] = [0.0] * len(cands)
        for ws in self.scorers:
            scorer, w = ws.scorer, ws.weight
            pspan = _start(trace, span, "scorer", scorer, cands) if trace is not None else None
            t0 = perf_counter() if timer else 0.0
            scores = scorer.score(request, cands)
            if pspan is not None:
                _end_scorer(pspan, w, cands, scores)
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
        pspan = None
        if trace is not None:
            pspan = _start(trace, span, "picker", self.picker, cands)
            _set_endpoint_scores(pspan, "llm_d.epp.picker", cands, totals)
        t0 = perf_counter() if timer else 0.0
        picked = self.picker.pick(request, cands, totals, rng)
        if timer:
            timer("picker", self.picker.type_name, self.picker.name, perf_counter() - t0)
        if pspan is not None:
            pspan.set_attribute("llm_d.epp.picker.picked", [v.key for v in picked])
            pspan.end()
        return ProfileResult(self.name, picked, cands, totals)


# -- tracing (sampled requests only) -------------------------------------------------------

def _start(trace: RequestTrace, parent: Span | None, kind: str, plugin: Any,
           cands: Sequence[EndpointView]) -> Span:
    """A plugin's span, named as upstream's (``llm_d.epp.scorer.<type>``)."""
    prefix = f"llm_d.epp.{kind}"
    return trace.span(f"{prefix}.{plugin.type_name}", {
        f"{prefix}.type": plugin.type_name, f"{prefix}.name": plugin.name,
        f"{prefix}.candidate_endpoints": len(cands)}, parent=parent)


def _end_scorer(span: Span, weight: float, cands: Sequence[EndpointView],
                scores: Sequence[float]) -> None:
    """The scorer's weight, its raw scores' max/min/avg and the first endpoints' scores."""
    attrs: dict[str, Any] = {"llm_d.epp.scorer.weight": weight}
    if scores:
        attrs["llm_d.epp.scorer.score.max"] = float(max(scores))
        attrs["llm_d.epp.scorer.score.min"] = float(min(scores))
        attrs["llm_d.epp.scorer.score.avg"] = float(sum(scores)) / len(scores)
        attrs["llm_d.epp.scorer.endpoints_scored"] = len(scores)
    _set_endpoint_scores(span, "llm_d.epp.scorer", cands, scores, attrs)
    span.end()


def _set_endpoint_scores(span: Span, prefix: str, cands: Sequence[EndpointView],
                         scores: Sequence[float], attrs: dict[str, Any] | None = None) -> None:
    """``<prefix>.endpoints`` and ``<prefix>.scores``: parallel arrays, the first
    :data:`TRACED_ENDPOINTS` candidates (with ``attrs``, in one call: the SDK locks per call)."""
    n = min(len(cands), len(scores), TRACED_ENDPOINTS)
    out = attrs if attrs is not None else {}
    out[f"{prefix}.endpoints"] = [cands[i].key for i in range(n)]
    out[f"{prefix}.scores"] = [float(scores[i]) for i in range(n)]
    span.set_attributes(out)
