"""``least-kv-cache-filter``: keep the endpoints with (nearly) the lowest KV usage."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.plugins.filter.legacy_predicates import least_kv_cache
from epp.scheduling.request import LLMRequest


class LeastKVCacheFilter(Filter):
    """Keeps KV usage in [min, min + (max - min) / n], n = number of candidates."""

    type_name = "least-kv-cache-filter"

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        return least_kv_cache(endpoints)
