"""``max-score-picker``: the highest total wins; ties are broken at random."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore import EndpointView
from epp.scheduling.plugin import Picker
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class MaxScoreParameters:
    """``maxNumOfEndpoints``: how many endpoints to return (fallbacks after the first)."""

    max_num_of_endpoints: int = 1


class MaxScorePicker(Picker):
    """Shuffle, sort by total score (descending), keep the top ``maxNumOfEndpoints``.

    For one endpoint the same distribution is reached without the shuffle and sort: one
    pass finds the maximum, then a uniform choice among the tied endpoints.
    """

    type_name = "max-score-picker"
    parameters_type = MaxScoreParameters
    params: MaxScoreParameters

    def pick(
        self,
        request: LLMRequest,
        endpoints: Sequence[EndpointView],
        scores: Sequence[float],
        rng: random.Random,
    ) -> list[EndpointView]:
        n = self.params.max_num_of_endpoints
        if not endpoints or n < 1:
            return []
        if n == 1:
            best = max(scores)
            tied = [i for i, s in enumerate(scores) if s == best]
            return [endpoints[tied[0] if len(tied) == 1 else rng.choice(tied)]]
        order = list(range(len(endpoints)))
        rng.shuffle(order)
        order.sort(key=scores.__getitem__, reverse=True)  # stable: shuffled ties stay random
        return [endpoints[i] for i in order[:n]]
