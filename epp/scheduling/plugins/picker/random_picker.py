"""``random-picker``: uniform random choice, ignoring scores."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore import EndpointView
from epp.scheduling.plugin import Picker
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class RandomPickerParameters:
    """``maxNumOfEndpoints``: how many distinct endpoints to return."""

    max_num_of_endpoints: int = 1


class RandomPicker(Picker):
    """Each candidate is equally likely; ``maxNumOfEndpoints`` distinct ones are returned."""

    type_name = "random-picker"
    parameters_type = RandomPickerParameters
    params: RandomPickerParameters

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
        if n == 1:
            return [endpoints[rng.randrange(len(endpoints))]]
        return rng.sample(list(endpoints), n)
