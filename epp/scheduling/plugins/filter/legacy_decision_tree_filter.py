"""``legacy-decision-tree-filter``: the v0.3 scheduler as one filter.

Pair it with ``random-picker`` (v0.3 picked at random among what the tree kept)::

    critical (priority >= criticalPriority):
        queue < 128 ?  yes -> LoRA affinity -> least queue -> least KV
                       no  -> least queue -> LoRA affinity -> least queue -> least KV
    otherwise:
        queue <= 5 and KV <= 0.8 ?  yes -> least queue -> LoRA affinity -> least queue
                                          -> least KV
                                    no  -> drop (empty set: the request is answered 429)

"LoRA affinity" keeps endpoints running the adapter, else those with room for one more,
else everything. A step whose subset is empty passes its input on unchanged, as v0.3 did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.plugins.filter.legacy_predicates import (
    has_capacity,
    least_kv_cache,
    least_queue,
    lora_active,
    lora_can_accept,
    low_queue,
)
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class DecisionTreeParameters:
    """v0.3 constants. ``criticalPriority``: requests at or above it take the critical path;
    1 = only legacy ``Critical`` models (criticality Critical maps to priority 1), as v0.3
    treated Standard like Sheddable here."""

    critical_priority: int = 1
    queueing_threshold_lora: int = 128
    queue_threshold_critical: int = 5
    kv_cache_threshold: float = 0.8


def _or_input(subset: list[EndpointView], given: Sequence[EndpointView]) -> Sequence[EndpointView]:
    return subset or given


class LegacyDecisionTreeFilter(Filter):
    """The v0.3 decision tree (see the module docstring)."""

    type_name = "legacy-decision-tree-filter"
    parameters_type = DecisionTreeParameters
    params: DecisionTreeParameters

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        p = self.params
        if request.priority >= p.critical_priority:
            low = low_queue(endpoints, p.queueing_threshold_lora)
            if low:
                return self._queue_and_kv(self._lora(request, low))
            return self._queue_lora_and_kv(request, endpoints)
        roomy = has_capacity(endpoints, p.queue_threshold_critical, p.kv_cache_threshold)
        if not roomy:
            return []
        return self._queue_lora_and_kv(request, roomy)

    @staticmethod
    def _lora(request: LLMRequest, eps: Sequence[EndpointView]) -> Sequence[EndpointView]:
        return (
            lora_active(eps, request.lora_adapter)
            or lora_can_accept(eps, request.lora_adapter)
            or eps
        )

    @staticmethod
    def _queue_and_kv(eps: Sequence[EndpointView]) -> Sequence[EndpointView]:
        eps = _or_input(least_queue(eps), eps)
        return _or_input(least_kv_cache(eps), eps)

    def _queue_lora_and_kv(
        self, request: LLMRequest, eps: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        eps = _or_input(least_queue(eps), eps)
        return self._queue_and_kv(self._lora(request, eps))
