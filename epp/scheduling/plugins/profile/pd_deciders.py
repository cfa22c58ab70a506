"""P/D deciders: whether a request, already placed on a decode endpoint, should prefill on a
separate prefill endpoint. A :class:`PDDecider` is named by the P/D profile handler's
``deciders.prefill`` (llm-d's names and parameters)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import structlog

from epp.datastore import EndpointView
from epp.scheduling.plugin import Plugin
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from epp.scheduling.request import CHARS_PER_TOKEN, LLMRequest
from shared.plugins import Handle

log = structlog.get_logger(__name__)


class PDDecider(Plugin, ABC):
    """Decides per request whether the prefill profile runs."""

    def bind(self) -> None:
        """Find the plugins this decider reads (called once every plugin exists); raise
        ValueError when one is missing."""

    @abstractmethod
    def disaggregate(self, request: LLMRequest, decode: EndpointView) -> bool:
        """True: prefill elsewhere; False: ``decode`` computes the prompt itself."""


class AlwaysDisaggPDDecider(PDDecider):
    """Every request is disaggregated (for tests and fleets where every prompt is long)."""

    type_name = "always-disagg-pd-decider"

    def disaggregate(self, request: LLMRequest, decode: EndpointView) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class PrefixBasedPDDeciderParameters:
    """``nonCachedTokens``: disaggregate when at least this many prompt tokens are not cached
    on the decode endpoint; 0 (the default, as llm-d) never disaggregates."""

    non_cached_tokens: int = 0

    def __post_init__(self) -> None:
        if self.non_cached_tokens < 0:
            raise ValueError("nonCachedTokens cannot be negative")


class PrefixBasedPDDecider(PDDecider):
    """uncached = prompt tokens - matched blocks on the decode endpoint * block tokens;
    disaggregate when uncached ≥ ``nonCachedTokens``.

    Prompt tokens are the request's token ids when it carries them, else prompt bytes ÷ 4
    (llm-d divides the characters by 4). The match is the one ``approx-prefix-cache-producer``
    made for this request (the producer a ``prefix-cache-scorer`` adds counts): the decider
    needs one in the config.
    """

    type_name = "prefix-based-pd-decider"
    parameters_type = PrefixBasedPDDeciderParameters
    params: PrefixBasedPDDeciderParameters

    def __init__(self, name: str = "", params: PrefixBasedPDDeciderParameters | None = None,
                 handle: Handle | None = None) -> None:
        super().__init__(name, params)
        self._handle = handle
        self._producer: ApproxPrefixCacheProducer | None = None
        self._block_tokens = 0

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> PrefixBasedPDDecider:
        if params.non_cached_tokens == 0:
            log.warning("prefix-based P/D disaggregation is off (nonCachedTokens: 0)",
                        plugin=name)
        return cls(name, params, handle)

    def bind(self, producer: ApproxPrefixCacheProducer | None = None) -> None:
        if producer is None:
            found = self._handle.find(ApproxPrefixCacheProducer) if self._handle else []
            if not found:
                raise ValueError(f"plugin {self.name!r} ({self.type_name}) needs a "
                                 f"prefix-cache-scorer or approx-prefix-cache-producer")
            producer = found[0]
        self._producer = producer
        p = producer.params
        self._block_tokens = p.block_size_tokens or max(1, p.block_size // CHARS_PER_TOKEN)

    def disaggregate(self, request: LLMRequest, decode: EndpointView) -> bool:
        threshold = self.params.non_cached_tokens
        if threshold == 0:
            return False
        if self._producer is None:
            self.bind()
        assert self._producer is not None
        ids = request.prompt_token_ids
        tokens = len(ids) if ids is not None else len(request.prompt) // CHARS_PER_TOKEN
        if tokens < threshold:
            return False
        hit = self._producer.match(request).matched.get(decode.endpoint.key, 0)
        return tokens - hit * self._block_tokens >= threshold
