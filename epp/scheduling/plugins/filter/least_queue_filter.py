"""``least-queue-filter``: keep the endpoints with (nearly) the shortest queue."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.plugins.filter.legacy_predicates import least_queue
from epp.scheduling.request import LLMRequest


class LeastQueueFilter(Filter):
    """Keeps queue in [min, min + (max - min) // n], n = number of candidates."""

    type_name = "least-queue-filter"

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        return least_queue(endpoints)
