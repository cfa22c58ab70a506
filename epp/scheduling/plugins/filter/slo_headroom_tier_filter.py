"""``slo-headroom-tier-filter`` (upstream v1.5): keep the candidates predicted to meet the
request's SLO, with a little exploration of the others."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epp.datastore import EndpointView
from epp.latency.predictions import predictions_of
from epp.scheduling.plugin import Filter
from epp.scheduling.request import LLMRequest
from shared.plugins import Handle


@dataclass(frozen=True, slots=True)
class TierFilterParameters:
    """``epsilonExploreNeg``: probability of keeping the negative tier when both exist."""

    epsilon_explore_neg: float = 0.01

    def __post_init__(self) -> None:
        if not 0 <= self.epsilon_explore_neg <= 1:
            raise ValueError(f"epsilonExploreNeg: must be in [0, 1], got "
                             f"{self.epsilon_explore_neg!r}")


class SloHeadroomTierFilter(Filter):
    """Positive tier: both headrooms ≥ 0; negative tier: the rest (and candidates without a
    prediction). Both tiers present: the positive one, or with probability
    ``epsilonExploreNeg`` the negative one (so recovering endpoints get re-measured). One
    tier, no predictions, or a request without an SLO: every candidate."""

    type_name = "slo-headroom-tier-filter"
    parameters_type = TierFilterParameters
    params: TierFilterParameters

    def __init__(self, name: str = "", params: Any = None,
                 rng: random.Random | None = None) -> None:
        super().__init__(name, params)
        self.rng = rng or random.Random()

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> SloHeadroomTierFilter:
        return cls(name, params, handle.rng)

    def filter(self, request: LLMRequest, endpoints: Sequence[EndpointView],
               ) -> Sequence[EndpointView]:
        preds = predictions_of(request)
        if preds is None or not preds.predicted or not preds.slo.any:
            return endpoints
        positive: list[EndpointView] = []
        negative: list[EndpointView] = []
        for v in endpoints:
            p = preds.by_endpoint.get(v.key)
            (positive if p is not None and p.valid else negative).append(v)
        if not positive or not negative:
            return endpoints
        return negative if self.rng.random() < self.params.epsilon_explore_neg else positive
