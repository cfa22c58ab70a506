"""``prefix-cache-affinity-filter`` (upstream v1.5, parameters and defaults of llm-d-router
v0.10): narrow the candidates to those that probably hold most of the prompt, unless that
costs too much TTFT."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from epp.datastore import EndpointView
from epp.latency.predictions import predictions_of
from epp.scheduling.plugin import Filter
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from epp.scheduling.request import LLMRequest
from shared.plugins import Handle


@dataclass(frozen=True, slots=True)
class AffinityFilterParameters:
    """llm-d-router v0.10's names and defaults (v1.5 had ``explorationProbability`` 0.01,
    ``maxTTFTPenaltyMs`` 5000 and only the predictor as TTFT source)."""

    ALIASES = {"maxTTFTPenaltyMs": "max_ttft_penalty_ms"}

    affinity_threshold: float = 0.80
    exploration_probability: float = 0.0
    max_ttft_penalty_ms: float = 18000.0
    ttft_source: Literal["prefillThroughput", "latencyPredictor"] = "prefillThroughput"
    peak_prefill_throughput: float = 15928.0

    def __post_init__(self) -> None:
        if not 0 <= self.affinity_threshold <= 1:
            raise ValueError("affinityThreshold: must be in [0, 1]")
        if not 0 <= self.exploration_probability <= 1:
            raise ValueError("explorationProbability: must be in [0, 1]")
        if self.max_ttft_penalty_ms < 0:
            raise ValueError("maxTTFTPenaltyMs: must be >= 0")
        if self.peak_prefill_throughput <= 0:
            raise ValueError("peakPrefillThroughput: must be > 0")


class PrefixCacheAffinityFilter(Filter):
    """Sticky candidates: prefix score (matched / total prompt blocks, from the
    ``approx-prefix-cache-producer``; one is added when the config has none) ≥
    ``affinityThreshold``. Keep only those, unless: none is sticky; the gate is skipped for
    exploration (probability ``explorationProbability``); or the best sticky TTFT exceeds the
    best non-sticky one by more than ``maxTTFTPenaltyMs`` (0: always stick). TTFT(e) =
    in-flight tokens(e) / ``peakPrefillThroughput`` * 1000 ms (``ttftSource:
    prefillThroughput``) or the predicted TTFT (``latencyPredictor``; skipped without
    predictions)."""

    type_name = "prefix-cache-affinity-filter"
    parameters_type = AffinityFilterParameters
    params: AffinityFilterParameters

    def __init__(self, name: str = "", params: Any = None,
                 producer: ApproxPrefixCacheProducer | None = None,
                 rng: random.Random | None = None) -> None:
        super().__init__(name, params)
        self.producer = producer or ApproxPrefixCacheProducer(
            f"{name}/{ApproxPrefixCacheProducer.type_name}")
        self.rng = rng or random.Random()

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> PrefixCacheAffinityFilter:
        found = handle.find(ApproxPrefixCacheProducer)
        plugin = cls(name, params, found[0] if found else None, rng=handle.rng)
        if not found:
            handle.add(plugin.producer)  # run as a producer and pre-request by the director
        return plugin

    def filter(self, request: LLMRequest, endpoints: Sequence[EndpointView],
               ) -> Sequence[EndpointView]:
        p = self.params
        if p.exploration_probability and self.rng.random() < p.exploration_probability:
            return endpoints
        match = self.producer.match(request)
        total = len(match.hashes)
        if not total:
            return endpoints
        threshold = p.affinity_threshold * total
        sticky = [v for v in endpoints if match.matched.get(v.key, 0) >= threshold]
        if not sticky or len(sticky) == len(endpoints):
            return endpoints
        if p.max_ttft_penalty_ms:
            ttft = self._ttft_ms(request)
            if ttft is not None:
                keys = {v.key for v in sticky}

                def best(views: Sequence[EndpointView]) -> float | None:
                    found = [t for v in views if (t := ttft(v)) is not None]
                    return min(found) if found else None

                b_sticky = best(sticky)
                b_other = best([v for v in endpoints if v.key not in keys])
                if (b_sticky is not None and b_other is not None
                        and b_sticky - b_other > p.max_ttft_penalty_ms):
                    return endpoints
        return sticky

    def _ttft_ms(self, request: LLMRequest) -> Callable[[EndpointView], float | None] | None:
        """The per-endpoint TTFT estimate in ms of ``ttftSource`` (None: no such source)."""
        p = self.params
        if p.ttft_source == "prefillThroughput":
            return lambda v: v.inflight_tokens / p.peak_prefill_throughput * 1000.0
        preds = predictions_of(request)
        if preds is None or not preds.predicted:
            return None

        def predicted(v: EndpointView) -> float | None:
            q = preds.by_endpoint.get(v.key)
            return q.ttft * 1000.0 if q is not None and q.ttft is not None else None

        return predicted
