"""``precise-prefix-cache-producer`` (llm-d v0.10): the KV-event index of
``precise-prefix-cache-scorer`` as a data producer, read by the generic ``prefix-cache-scorer``
(``prefixMatchInfoProducerName``). Same parameters, sockets and fallback as the scorer
(:mod:`epp.scheduling.plugins.prefix.precise_prefix_cache_scorer`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import DataProducer
from epp.scheduling.plugins.prefix.precise_prefix_cache_scorer import PrecisePrefixCache
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class PreciseMatch:
    """One request's match: per endpoint key, leading blocks held / full prompt blocks."""

    fractions: dict[str, float]
    #: Whether token ids were there when it was made (without them it is the fallback's).
    tokens: bool
    #: Full blocks of the prompt and tokens per block (for ``matchLengthWeight``).
    blocks: int
    block_tokens: int


class PrecisePrefixCacheProducer(PrecisePrefixCache, DataProducer):
    """match(endpoint) = leading prompt blocks the endpoint's own KV events say it holds /
    full blocks of the prompt (the approximate fallback's guess for endpoints whose event
    stream is down, or for all without token ids)."""

    type_name = "precise-prefix-cache-producer"

    def produce(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        self.precise_match(request, endpoints)

    def precise_match(self, request: LLMRequest,
                      endpoints: Sequence[EndpointView]) -> PreciseMatch:
        """The match for ``endpoints`` (made once per request; again when token ids arrived
        since, or for endpoints it did not cover)."""
        key = f"{self.name}/match"
        ids = request.prompt_token_ids
        found = request.plugin_state.get(key)
        if (isinstance(found, PreciseMatch) and found.tokens == (ids is not None)
                and all(v.endpoint.key in found.fractions for v in endpoints)):
            return found
        scores = self.fractions(request, endpoints)
        match = PreciseMatch(
            {v.endpoint.key: s for v, s in zip(endpoints, scores, strict=True)},
            ids is not None, len(ids) // self.block_size if ids is not None else 0,
            self.block_size)
        request.plugin_state[key] = match
        return match
