"""``concurrency-detector``: saturation from what this EPP has in flight, not from scraped
metrics (upstream's alternative detector; useful when metrics are slow or absent)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import SaturationDetector
from epp.scheduling.plugin import Filter
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class ConcurrencyParameters:
    """``maxConcurrency`` (requests per endpoint) or, with ``concurrencyMode: tokens``,
    ``maxTokenConcurrency`` (estimated prompt tokens per endpoint); ``headroom`` is the
    burst the filter allows above that (0.2 = 20%)."""

    max_concurrency: int = 100
    headroom: float = 0.0
    concurrency_mode: Literal["requests", "tokens"] = "requests"
    max_token_concurrency: int = 1_000_000

    def __post_init__(self) -> None:
        if self.max_concurrency <= 0 or self.max_token_concurrency <= 0:
            raise ValueError("maxConcurrency and maxTokenConcurrency must be > 0")
        if self.headroom < 0:
            raise ValueError(f"headroom: must be >= 0, got {self.headroom!r}")


class ConcurrencyDetector(Filter, SaturationDetector):
    """load(e) = in-flight requests (or tokens) on e; pool saturation = sum(load) /
    (endpoints x capacity), saturated when >= 1 (an empty pool is saturated). As a filter
    it keeps endpoints with load < capacity x (1 + headroom)."""

    type_name = "concurrency-detector"
    parameters_type = ConcurrencyParameters
    params: ConcurrencyParameters

    def _capacity(self) -> int:
        p = self.params
        return p.max_token_concurrency if p.concurrency_mode == "tokens" else p.max_concurrency

    def _load(self, view: EndpointView) -> int:
        tokens = self.params.concurrency_mode == "tokens"
        return view.inflight_tokens if tokens else view.inflight_requests

    def saturation(self, views: Sequence[EndpointView]) -> float:
        if not views:
            return 1.0
        return sum(self._load(v) for v in views) / (len(views) * self._capacity())

    def is_saturated(self, views: Sequence[EndpointView], now: float | None = None) -> bool:
        return self.saturation(views) >= 1.0

    def filter(self, request: LLMRequest,
               endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        limit = self._capacity() * (1.0 + self.params.headroom)
        return [v for v in endpoints if self._load(v) < limit]
