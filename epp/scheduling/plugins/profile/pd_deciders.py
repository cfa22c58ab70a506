"""P/D deciders: whether a request, already placed on a decode endpoint, should prefill on a
separate prefill endpoint. A :class:`PDDecider` is named by the P/D profile handler's
``deciders.prefill`` (llm-d's names and parameters)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import structlog

from epp.datastore import Datastore, EndpointView
from epp.handle import EppHandle
from epp.scheduling.plugin import Plugin
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer, state_store_of
from epp.scheduling.request import CHARS_PER_TOKEN, LLMRequest
from modelserver.pd import can_prefill
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
    on the decode endpoint; 0 (the default, as llm-d) never disaggregates. ``promptTokens``
    (llm-d-router v0.10): prompts shorter than this never disaggregate; 0 (default): no
    such gate."""

    non_cached_tokens: int = 0
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        if self.non_cached_tokens < 0:
            raise ValueError("nonCachedTokens cannot be negative")
        if self.prompt_tokens < 0:
            raise ValueError("promptTokens cannot be negative")


class PrefixBasedPDDecider(PDDecider):
    """uncached = prompt tokens - matched blocks on the decode endpoint * block tokens;
    disaggregate when prompt tokens ≥ ``promptTokens`` and uncached ≥ ``nonCachedTokens``.

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
            if not found and self._handle is not None:
                # llm-d-router v0.10 creates the producer a consumer needs when the config
                # has none (its default producer for PrefixCacheMatchInfo).
                own = ApproxPrefixCacheProducer(ApproxPrefixCacheProducer.type_name,
                                                store=state_store_of(self._handle))
                if own.name in self._handle:
                    own.name = f"{self.name}/{own.type_name}"
                self._handle.add(own)
                found = [own]
            if not found:
                raise ValueError(f"plugin {self.name!r} ({self.type_name}) needs a "
                                 f"prefix-cache-scorer or approx-prefix-cache-producer")
            producer = found[0]
        self._producer = producer
        self._block_tokens = producer.tokens_per_block

    def disaggregate(self, request: LLMRequest, decode: EndpointView) -> bool:
        threshold = self.params.non_cached_tokens
        if threshold == 0:
            return False
        if self._producer is None:
            self.bind()
        assert self._producer is not None
        ids = request.prompt_token_ids
        tokens = len(ids) if ids is not None else len(request.prompt) // CHARS_PER_TOKEN
        # load-aware-pd-decider (ours, a subclass) has no promptTokens gate
        if tokens < threshold or tokens < getattr(self.params, "prompt_tokens", 0):
            return False
        hit = self._producer.match(request).matched.get(decode.endpoint.key, 0)
        return tokens - hit * self._block_tokens >= threshold


@dataclass(frozen=True, slots=True)
class LoadAwarePDDeciderParameters:
    """``nonCachedTokens``: the prefix test of ``prefix-based-pd-decider`` (here at least 1);
    ``prefillBacklogTokens``: a prompt that passes it is prefilled on its decode pod instead
    when even the least-loaded prefill pod has at least this many prompt tokens in flight
    and the decode pod has at most ``maxDecodeRequests`` requests in flight. All three are
    required."""

    non_cached_tokens: int = 0
    prefill_backlog_tokens: int = 0
    max_decode_requests: int = -1

    def __post_init__(self) -> None:
        if self.non_cached_tokens < 1:
            raise ValueError("nonCachedTokens must be at least 1")
        if self.prefill_backlog_tokens < 1:
            raise ValueError("prefillBacklogTokens must be at least 1")
        if self.max_decode_requests < 0:
            raise ValueError("maxDecodeRequests is required and cannot be negative")


class LoadAwarePDDecider(PrefixBasedPDDecider):
    """Ours (llm-d has no equivalent): ``prefix-based-pd-decider``'s test, then a prompt it
    would disaggregate stays on its decode pod when the prefill pods are backlogged and the
    decode pod is nearly idle, so a burst of long prompts spills onto decode pods that have
    room instead of queueing behind two busy prefill pods (docs/pd.md, "Spilling prefills
    onto idle decode pods").

    Backlogged: every prefill-capable candidate of the pool (``prefill-filter``'s roles, the
    scheduler's candidates) has at least ``prefillBacklogTokens`` prompt tokens in flight, as
    ``inflight-load-producer`` counts them (the prefill pick from the pick to the response
    headers). Nearly idle: the decode pod has at most ``maxDecodeRequests`` requests in
    flight (this request not yet counted). A pool without prefill candidates is left to the
    prefill profile (which then finds none, as before).
    """

    type_name = "load-aware-pd-decider"
    parameters_type = LoadAwarePDDeciderParameters  # type: ignore[assignment]
    params: LoadAwarePDDeciderParameters  # type: ignore[assignment]

    def __init__(self, name: str = "", params: LoadAwarePDDeciderParameters | None = None,
                 handle: Handle | None = None) -> None:
        super().__init__(name, params, handle)  # type: ignore[arg-type]
        self._datastore: Datastore | None = None

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> LoadAwarePDDecider:
        return cls(name, params, handle)

    def bind(self, producer: ApproxPrefixCacheProducer | None = None) -> None:
        super().bind(producer)
        if not isinstance(self._handle, EppHandle):
            raise ValueError(f"plugin {self.name!r} ({self.type_name}) reads the pool's "
                             f"in-flight counts: it runs only inside the EPP")
        self._datastore = self._handle.datastore

    def disaggregate(self, request: LLMRequest, decode: EndpointView) -> bool:
        if not super().disaggregate(request, decode):
            return False
        if decode.inflight_requests > self.params.max_decode_requests:
            return True
        if self._datastore is None:
            self.bind()
        assert self._datastore is not None
        backlogs = [v.inflight_tokens for v in self._datastore.candidates()
                    if can_prefill(v.endpoint.labels)]
        if not backlogs or min(backlogs) < self.params.prefill_backlog_tokens:
            return True
        log.debug("prefill pods backlogged: prefilling on the decode pod", plugin=self.name,
                  decode=decode.key, least_prefill_tokens=min(backlogs),
                  decode_requests=decode.inflight_requests)
        return False
