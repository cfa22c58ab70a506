"""``load-aware-scorer`` (llm-d): half credit for an empty queue, falling to 0 at a threshold."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class LoadAwareParameters:
    """``threshold``: queue length at which the score reaches 0."""

    threshold: int = 128


class LoadAwareScorer(Scorer):
    """score = 0.5 * (1 - min(q, threshold) / threshold); an empty queue scores 0.5.

    ``q`` is :attr:`EndpointView.queue` (scraped waiting + unreflected picks).
    """

    type_name = "load-aware-scorer"
    parameters_type = LoadAwareParameters
    bounded = True
    params: LoadAwareParameters

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        th = max(1, self.params.threshold)
        return [0.5 * (1.0 - min(v.queue, th) / th) for v in endpoints]
