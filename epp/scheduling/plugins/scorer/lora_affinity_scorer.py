"""``lora-affinity-scorer``: prefer endpoints that already have the request's adapter."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest


class LoraAffinityScorer(Scorer):
    """score = 1.0 adapter active (running); 0.8 room to load it (active + waiting adapters
    < max_lora); 0.6 adapter waiting; else 0.

    A request without an adapter scores 1.0 everywhere (no preference).
    """

    type_name = "lora-affinity-scorer"
    bounded = True

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        adapter = request.lora_adapter
        if adapter is None:
            return [1.0] * len(endpoints)
        return [lora_score(v, adapter) for v in endpoints]


def lora_score(view: EndpointView, adapter: str) -> float:
    """The affinity score of one endpoint for ``adapter`` (see :class:`LoraAffinityScorer`)."""
    lora = view.metrics.lora
    if lora is None:
        return 0.0
    if adapter in lora.running:
        return 1.0
    if len(lora.running) + len(lora.waiting) < lora.max_lora:
        return 0.8
    if adapter in lora.waiting:
        return 0.6
    return 0.0
