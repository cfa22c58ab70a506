"""``prefix-cache-scorer``: prefer endpoints that hold the prompt's prefix in cache, as
reported by ``approx-prefix-cache-producer`` (a guess from past picks) or, llm-d v0.10's
split, ``precise-prefix-cache-producer`` (the servers' KV events), named by
``prefixMatchInfoProducerName``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from epp.datastore import EndpointView
from epp.scheduling.plugin import EndpointsRemoved, Plugin, PostPick, SchedulerHooks, Scorer
from epp.scheduling.plugins.prefix.precise_prefix_cache_producer import (
    PrecisePrefixCacheProducer,
)
from epp.scheduling.plugins.prefix.producer import (
    ApproxPrefixCacheProducer,
    PrefixCacheParameters,
    PrefixMatch,
    state_store_of,
)
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from epp.statestore import StateStore
from shared.plugins import Handle, PluginError

__all__ = ["PrefixCacheParameters", "PrefixCacheScorer", "PrefixCacheScorerParameters",
           "PrefixMatch"]


@dataclass(frozen=True, slots=True)
class PrefixCacheScorerParameters(PrefixCacheParameters):
    """The producer's parameters (older configs put them on the scorer) and llm-d v0.10's
    own: ``prefixMatchInfoProducerName`` (the producer plugin to read; default: the one
    approximate producer), ``matchLengthWeight`` (0-1) and ``matchLengthScaleTokens``."""

    prefix_match_info_producer_name: str | None = None
    match_length_weight: float = 0.0
    match_length_scale_tokens: int = 8192

    def __post_init__(self) -> None:
        if not 0.0 <= self.match_length_weight <= 1.0:
            raise ValueError(f"matchLengthWeight: must be between 0 and 1, got "
                             f"{self.match_length_weight}")
        if self.match_length_weight > 0 and self.match_length_scale_tokens <= 0:
            raise ValueError("matchLengthScaleTokens: must be > 0 when matchLengthWeight > 0")

    def producer_parameters(self) -> PrefixCacheParameters:
        """Only the producer's fields."""
        return PrefixCacheParameters(
            auto_tune=self.auto_tune, block_size=self.block_size,
            block_size_tokens=self.block_size_tokens,
            max_prefix_blocks_to_match=self.max_prefix_blocks_to_match,
            max_prefix_tokens_to_match=self.max_prefix_tokens_to_match,
            lru_capacity_per_server=self.lru_capacity_per_server)


class PrefixCacheScorer(Scorer, PostPick, EndpointsRemoved):
    """ratio = matched consecutive blocks / total blocks of the prompt (see
    :class:`ApproxPrefixCacheProducer` for how blocks are hashed and learnt); with
    ``matchLengthWeight`` w (llm-d v0.10), length = min(1, matched blocks x tokens per block /
    ``matchLengthScaleTokens``) and score = w x length^2 + (1 - w) x ratio.

    The scorer reads the configured ``approx-prefix-cache-producer``; when the config has
    none it makes its own from its parameters (older upstream configs put the prefix
    parameters on the scorer), as upstream's loader adds the producer.
    """

    type_name = "prefix-cache-scorer"
    parameters_type = PrefixCacheScorerParameters
    bounded = True
    params: PrefixCacheScorerParameters

    def __init__(self, name: str = "", params: PrefixCacheParameters | None = None,
                 producer: ApproxPrefixCacheProducer | None = None,
                 store: StateStore | None = None,
                 precise: PrecisePrefixCacheProducer | None = None) -> None:
        if params is not None and not isinstance(params, PrefixCacheScorerParameters):
            params = PrefixCacheScorerParameters(**{
                f.name: getattr(params, f.name) for f in fields(PrefixCacheParameters)})
        super().__init__(name, params)
        #: The precise producer read instead of the approximate one, when named.
        self.precise = precise
        self.producer = producer or ApproxPrefixCacheProducer(
            ApproxPrefixCacheProducer.type_name, self.params.producer_parameters(), store)

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> PrefixCacheScorer:
        p: PrefixCacheScorerParameters = params
        own = p.producer_parameters() != PrefixCacheParameters()
        if p.prefix_match_info_producer_name is not None:
            ref = p.prefix_match_info_producer_name
            named = handle.plugin(ref, Plugin)
            if own:
                raise PluginError("with prefixMatchInfoProducerName, give the prefix "
                                  "parameters to the producer, not the scorer")
            if isinstance(named, PrecisePrefixCacheProducer):
                # Learns nothing itself: the servers' events are the truth.
                return cls(name, params, ApproxPrefixCacheProducer(
                    f"{name}/unused", store=state_store_of(handle)), precise=named)
            if isinstance(named, ApproxPrefixCacheProducer):
                return cls(name, params, named)
            raise PluginError(f"prefixMatchInfoProducerName: plugin {ref!r} "
                              f"({named.type_name}) is not a prefix-cache producer")
        found = handle.find(ApproxPrefixCacheProducer)
        if found:
            if own:
                raise PluginError("with an approx-prefix-cache-producer configured, give the "
                                  "prefix parameters to the producer, not the scorer")
            return cls(name, params, found[0])
        scorer = cls(name, params, store=state_store_of(handle))
        if scorer.producer.name in handle:
            scorer.producer.name = f"{name}/{ApproxPrefixCacheProducer.type_name}"
        handle.add(scorer.producer)  # the director runs it as a producer and pre-request
        return scorer

    def attach(self, hooks: SchedulerHooks) -> None:
        self.producer.attach(hooks)

    @property
    def store(self) -> StateStore:
        """Where the producer keeps the index."""
        return self.producer.store

    @property
    def indexer_size(self) -> int:
        """Entries in the producer's index (``inference_extension_prefix_indexer_size``)."""
        return self.producer.indexer_size

    @property
    def hit_ratio(self) -> float:
        return self.producer.hit_ratio

    def block_hashes(self, request: LLMRequest) -> list[int]:
        return self.producer.block_hashes(request)

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        w = self.params.match_length_weight
        if self.precise is not None:
            m = self.precise.precise_match(request, endpoints)
            ratios = [m.fractions.get(v.endpoint.key, 0.0) for v in endpoints]
            if w == 0.0:
                return ratios
            return [self._blend(r, r * m.blocks, m.block_tokens) for r in ratios]
        state = self.producer.match(request)
        if not state.matched:
            return [0.0] * len(endpoints)
        total = len(state.hashes)
        get = state.matched.get
        if w == 0.0:
            return [get(v.endpoint.key, 0) / total for v in endpoints]
        tokens = self.producer.tokens_per_block
        return [self._blend(get(v.endpoint.key, 0) / total, get(v.endpoint.key, 0), tokens)
                for v in endpoints]

    def _blend(self, ratio: float, matched_blocks: float, block_tokens: int) -> float:
        w = self.params.match_length_weight
        length = min(1.0, matched_blocks * block_tokens / self.params.match_length_scale_tokens)
        return w * length * length + (1.0 - w) * ratio

    def post_pick(self, request: LLMRequest, result: SchedulingResult) -> None:
        if self.precise is not None:
            return  # the precise producer records the pick itself (pre-request)
        picked = result.primary.picked
        if picked:
            self.producer.record(request, picked[0])

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        self.producer.retain_endpoints(keys)
