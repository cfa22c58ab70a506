"""``concurrency-detector``: saturation from what this EPP has in flight, not from scraped
metrics (upstream's alternative detector; useful when metrics are slow or absent).

``maxPrefillConcurrency`` (ours, off unless set) also limits the streamed requests per
endpoint that have not shown their first token yet - the ones whose prompt the engine is
still computing (or has not started). An endpoint at that limit takes nothing more until
one of them streams its first token, so a request that goes there does not share its
prefill steps with several others' (docs/flow-control.md, "Tenants under a flood").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from epp.datastore import EndpointView
from epp.requestcontrol.counts import take
from epp.requestcontrol.plugin import (
    FirstToken,
    PreRequest,
    Response,
    ResponseComplete,
    SaturationDetector,
)
from epp.scheduling.plugin import Filter
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult


@dataclass(frozen=True, slots=True)
class ConcurrencyParameters:
    """``maxConcurrency`` (requests per endpoint) or, with ``concurrencyMode: tokens``,
    ``maxTokenConcurrency`` (estimated prompt tokens per endpoint), or both with
    ``concurrencyMode: hybrid`` (upstream v0.10); ``headroom`` is the
    burst the filter allows above that (0.2 = 20%). ``maxPrefillConcurrency`` (ours; None =
    no limit): streamed requests per endpoint still waiting for their first token."""

    max_concurrency: int = 100
    headroom: float = 0.0
    concurrency_mode: Literal["requests", "tokens", "hybrid"] = "requests"
    max_token_concurrency: int = 1_000_000
    max_prefill_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.max_concurrency <= 0 or self.max_token_concurrency <= 0:
            raise ValueError("maxConcurrency and maxTokenConcurrency must be > 0")
        if self.headroom < 0:
            raise ValueError(f"headroom: must be >= 0, got {self.headroom!r}")
        if self.max_prefill_concurrency is not None and self.max_prefill_concurrency <= 0:
            raise ValueError("maxPrefillConcurrency: must be > 0 (leave it out for no "
                             f"limit), got {self.max_prefill_concurrency!r}")


class ConcurrencyDetector(Filter, SaturationDetector, PreRequest, FirstToken, ResponseComplete):
    """load(e) = in-flight requests (or tokens) on e; pool saturation = sum(load) /
    (endpoints x capacity), saturated when >= 1 (an empty pool is saturated). As a filter
    it keeps endpoints with load < capacity x (1 + headroom).

    ``hybrid`` (upstream v0.10): per endpoint s(e) = max(requests(e) / maxConcurrency,
    tokens(e) / maxTokenConcurrency); pool saturation = mean of s(e), so endpoints saturated
    on different dimensions are not masked by two low aggregates. The filter drops an
    endpoint when either load reaches its limit x (1 + headroom).

    With ``maxPrefillConcurrency`` an endpoint also needs fewer than that many requests
    awaiting their first token: the filter drops the others, and while no endpoint has room
    on both counts the pool's saturation is 1 (flow control holds requests until a first
    token or an end frees one).
    """

    type_name = "concurrency-detector"
    parameters_type = ConcurrencyParameters
    params: ConcurrencyParameters

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)
        #: Per endpoint key: streamed requests picked there, first token not seen yet.
        self.prefilling: dict[str, int] = {}

    def _capacity(self) -> int:
        p = self.params
        return p.max_token_concurrency if p.concurrency_mode == "tokens" else p.max_concurrency

    def _load(self, view: EndpointView) -> int:
        tokens = self.params.concurrency_mode == "tokens"
        return view.inflight_tokens if tokens else view.inflight_requests

    def _prefill_room(self, view: EndpointView) -> bool:
        limit = self.params.max_prefill_concurrency
        return limit is None or self.prefilling.get(view.key, 0) < limit

    def _ratio(self, view: EndpointView) -> float:
        """Hybrid mode: the endpoint's fuller dimension, as a fraction of its capacity."""
        p = self.params
        return max(view.inflight_requests / p.max_concurrency,
                   view.inflight_tokens / p.max_token_concurrency)

    def saturation(self, views: Sequence[EndpointView]) -> float:
        if not views:
            return 1.0
        if self.params.concurrency_mode == "hybrid":
            sat = sum(self._ratio(v) for v in views) / len(views)
            if sat < 1.0 and self.params.max_prefill_concurrency is not None and not any(
                    self._ratio(v) < 1.0 and self._prefill_room(v) for v in views):
                return 1.0
            return sat
        capacity = self._capacity()
        sat = sum(self._load(v) for v in views) / (len(views) * capacity)
        if sat < 1.0 and self.params.max_prefill_concurrency is not None and not any(
                self._load(v) < capacity and self._prefill_room(v) for v in views):
            return 1.0  # every endpoint with a free slot is at its prefill limit
        return sat

    def is_saturated(self, views: Sequence[EndpointView], now: float | None = None) -> bool:
        return self.saturation(views) >= 1.0

    def filter(self, request: LLMRequest,
               endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        burst = 1.0 + self.params.headroom
        if self.params.concurrency_mode == "hybrid":
            return [v for v in endpoints if self._ratio(v) < burst and self._prefill_room(v)]
        limit = self._capacity() * burst
        return [v for v in endpoints if self._load(v) < limit and self._prefill_room(v)]

    # -- the prefill count (only with maxPrefillConcurrency) ---------------------------

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        if self.params.max_prefill_concurrency is None or not request.stream:
            return  # a response that is not streamed shows no first token before its end
        key = result.endpoints[0].key
        self.prefilling[key] = self.prefilling.get(key, 0) + 1
        request.plugin_state[self.name] = key

    def first_token(self, request: LLMRequest, response: Response,
                    endpoint: EndpointView) -> None:
        self._prefilled(request)

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        self._prefilled(request)

    def _prefilled(self, request: LLMRequest) -> None:
        """``request`` stopped prefilling (first token, or its exchange ended): once."""
        key = request.plugin_state.pop(self.name, None)
        if key is not None:
            take(self.prefilling, key)

