"""``prefix-cache-scorer``: prefer endpoints that probably hold the prompt's prefix in cache,
as reported by ``approx-prefix-cache-producer``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.datastore import EndpointView
from epp.scheduling.plugin import EndpointsRemoved, PostPick, SchedulerHooks, Scorer
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

__all__ = ["PrefixCacheParameters", "PrefixCacheScorer", "PrefixMatch"]


class PrefixCacheScorer(Scorer, PostPick, EndpointsRemoved):
    """score = matched consecutive blocks / total blocks of the prompt (see
    :class:`ApproxPrefixCacheProducer` for how blocks are hashed and learnt).

    The scorer reads the configured ``approx-prefix-cache-producer``; when the config has
    none it makes its own from its parameters (older upstream configs put the prefix
    parameters on the scorer), as upstream's loader adds the producer.
    """

    type_name = "prefix-cache-scorer"
    parameters_type = PrefixCacheParameters
    bounded = True
    params: PrefixCacheParameters

    def __init__(self, name: str = "", params: PrefixCacheParameters | None = None,
                 producer: ApproxPrefixCacheProducer | None = None,
                 store: StateStore | None = None) -> None:
        super().__init__(name, params)
        self.producer = producer or ApproxPrefixCacheProducer(
            ApproxPrefixCacheProducer.type_name, self.params, store)

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> PrefixCacheScorer:
        found = handle.find(ApproxPrefixCacheProducer)
        if found:
            if params != PrefixCacheParameters():
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
        state = self.producer.match(request)
        if not state.matched:
            return [0.0] * len(endpoints)
        total = len(state.hashes)
        get = state.matched.get
        return [get(v.endpoint.key, 0) / total for v in endpoints]

    def post_pick(self, request: LLMRequest, result: SchedulingResult) -> None:
        picked = result.primary.picked
        if picked:
            self.producer.record(request, picked[0])

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        self.producer.retain_endpoints(keys)
