"""``weighted-random-picker``: random choice weighted by total score (A-Res)."""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore import EndpointView
from epp.scheduling.plugin import Picker
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class WeightedRandomParameters:
    """``maxNumOfEndpoints``: how many distinct endpoints to return."""

    max_num_of_endpoints: int = 1


class WeightedRandomPicker(Picker):
    """A-Res weighted sampling without replacement: key_i = u_i ** (1 / w_i), u_i ~ U(0, 1);
    the ``maxNumOfEndpoints`` largest keys win. P(first pick = i) = w_i / sum(w).

    Endpoints scoring 0 are picked only after every positive one; if all score 0 the choice
    is uniform.
    """

    type_name = "weighted-random-picker"
    parameters_type = WeightedRandomParameters
    params: WeightedRandomParameters

    def pick(
        self,
        request: LLMRequest,
        endpoints: Sequence[EndpointView],
        scores: Sequence[float],
        rng: random.Random,
    ) -> list[EndpointView]:
        n = min(self.params.max_num_of_endpoints, len(endpoints))
        if n < 1:
            return []
        if not any(s > 0.0 for s in scores):
            return rng.sample(list(endpoints), n)
        rand = rng.random
        # Zero weights get key -1 so they rank below every positive-weight key in [0, 1).
        keys = [rand() ** (1.0 / s) if s > 0.0 else -1.0 for s in scores]
        best = heapq.nlargest(n, range(len(keys)), key=keys.__getitem__)
        return [endpoints[i] for i in best]
