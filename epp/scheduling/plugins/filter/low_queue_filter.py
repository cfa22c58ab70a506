"""``low-queue-filter``: drop endpoints whose queue has reached a threshold."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.plugins.filter.legacy_predicates import low_queue
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class LowQueueParameters:
    """``threshold``: endpoints with a queue this long or longer are removed."""

    threshold: int = 128


class LowQueueFilter(Filter):
    """Keeps queue < threshold (128)."""

    type_name = "low-queue-filter"
    parameters_type = LowQueueParameters
    params: LowQueueParameters

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        return low_queue(endpoints, self.params.threshold)
