"""``lora-affinity-filter``: prefer endpoints that have, or can load, the request's adapter."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.plugins.filter.legacy_predicates import lora_active, lora_can_accept
from epp.scheduling.request import LLMRequest


class LoraAffinityFilter(Filter):
    """Keeps endpoints running the adapter; if none, those with room for another adapter;
    if none either, every candidate (never empties the set on its own)."""

    type_name = "lora-affinity-filter"

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        return (
            lora_active(endpoints, request.lora_adapter)
            or lora_can_accept(endpoints, request.lora_adapter)
            or endpoints
        )
