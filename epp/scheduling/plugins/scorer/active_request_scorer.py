"""``active-request-scorer`` (llm-d): prefer endpoints with fewer requests in flight."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest
from shared.plugins import Duration


@dataclass(frozen=True, slots=True)
class ActiveRequestParameters:
    """``idleThreshold``: at or below this many requests in flight an endpoint is idle;
    ``maxBusyScore``: the best score a busy endpoint can get; ``requestTimeout``: accepted
    and ignored, as in llm-d (the in-flight count is the EPP's own accounting)."""

    idle_threshold: int = 0
    max_busy_score: float = 1.0
    request_timeout: Duration | None = None

    def __post_init__(self) -> None:
        if self.idle_threshold < 0:
            raise ValueError("idleThreshold must be >= 0")
        if not 0.0 <= self.max_busy_score <= 1.0:
            raise ValueError("maxBusyScore must be in [0, 1]")


class ActiveRequestScorer(Scorer):
    """n = requests the EPP has in flight on the endpoint; n <= idleThreshold → 1, else
    (max_n - n) / max_n x maxBusyScore, max_n being the busiest candidate's count."""

    type_name = "active-request-scorer"
    parameters_type = ActiveRequestParameters
    bounded: ClassVar[bool] = True
    params: ActiveRequestParameters

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        counts = [v.inflight_requests for v in endpoints]
        top = max(counts, default=0)
        idle, busy = self.params.idle_threshold, self.params.max_busy_score
        return [1.0 if n <= idle else (top - n) / top * busy for n in counts]
