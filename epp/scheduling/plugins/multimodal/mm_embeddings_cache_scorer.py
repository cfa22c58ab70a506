"""``mm-embeddings-cache-scorer`` (llm-d-router v0.10): prefer endpoints that probably hold
the request's images (video, audio) in their encoder cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.plugins.multimodal.mm_embeddings_cache_producer import (
    MMEmbeddingsCacheProducer,
)
from epp.scheduling.request import LLMRequest
from shared.plugins import Handle


class MMEmbeddingsCacheScorer(Scorer):
    """score = the request's unique multimodal items the endpoint probably holds / all its
    unique items (each item weighs 1), as ``mm-embeddings-cache-producer`` matched them; 0
    for every endpoint when the request has none.

    No parameters. Reads the configured producer (the first one); a config without one gets
    one with the default size, as llm-d's loader adds the producer a scorer consumes.
    """

    type_name = "mm-embeddings-cache-scorer"
    bounded = True

    def __init__(self, name: str = "", params: Any = None,
                 producer: MMEmbeddingsCacheProducer | None = None) -> None:
        super().__init__(name, params)
        self.producer = producer or MMEmbeddingsCacheProducer(MMEmbeddingsCacheProducer.type_name)

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> MMEmbeddingsCacheScorer:
        found = handle.find(MMEmbeddingsCacheProducer)
        if found:
            return cls(name, params, found[0])
        scorer = cls(name, params)
        if scorer.producer.name in handle:
            scorer.producer.name = f"{name}/{MMEmbeddingsCacheProducer.type_name}"
        handle.add(scorer.producer)  # the director runs it as a producer and pre-request
        return scorer

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        match = self.producer.match(request)
        if not match.matched:
            return [0.0] * len(endpoints)
        total = len(match.items)
        get = match.matched.get
        return [get(v.key, 0) / total for v in endpoints]
