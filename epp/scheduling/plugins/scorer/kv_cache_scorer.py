"""``kv-cache-utilization-scorer``: prefer the endpoint with the most free KV cache."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest


class KVCacheUtilizationScorer(Scorer):
    """score = 1 - kv_usage (kv_usage is a fraction in [0, 1]; the scraper clamps it)."""

    type_name = "kv-cache-utilization-scorer"
    bounded = True

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        return [1.0 - v.metrics.kv_usage for v in endpoints]
