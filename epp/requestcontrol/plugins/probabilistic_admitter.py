"""``probabilistic-admitter`` (llm-d): sheds sheddable requests with a probability that
rises steeply with the pool's saturation, instead of all at once."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epp.datastore import EndpointView
from epp.handle import EppHandle
from epp.requestcontrol.plugin import Admitter
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest
from shared.errors import TooManyRequests
from shared.plugins import Handle


class Shed(TooManyRequests):
    """429: rejected by the probabilistic admitter."""

    code = "shed"


@dataclass(frozen=True, slots=True)
class ProbabilisticParameters:
    """``queueDepthThreshold`` / ``kvCacheUtilThreshold``: per-endpoint load counted as
    fully saturated; ``power`` and ``k`` shape the curve (100% shed at saturation
    (1/k)^(1/power), ≈ 0.34 with the defaults)."""

    queue_depth_threshold: float = 5.0
    kv_cache_util_threshold: float = 0.8
    power: float = 5.0
    k: float = 300.0

    def __post_init__(self) -> None:
        for name in ("queue_depth_threshold", "kv_cache_util_threshold", "power", "k"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0")


class ProbabilisticAdmitter(Plugin, Admitter):
    """Priority >= 0, or no candidates: admitted. Sheddable (priority < 0): saturation s =
    mean over candidates of max(waiting/queueDepthThreshold, kv/kvCacheUtilThreshold), an
    endpoint without fresh metrics counting 1; rejected (429 ``shed``) with probability
    min(s^power x k, 1)."""

    type_name = "probabilistic-admitter"
    parameters_type = ProbabilisticParameters
    params: ProbabilisticParameters

    def __init__(self, name: str = "", params: Any = None, *, staleness: float = 2.0,
                 rng: random.Random | None = None) -> None:
        super().__init__(name, params)
        self.staleness = staleness
        self.rng = rng or random.Random()

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> ProbabilisticAdmitter:
        staleness = handle.settings.staleness if isinstance(handle, EppHandle) else 2.0
        return cls(name, params, staleness=staleness, rng=handle.rng)

    def saturation(self, endpoints: Sequence[EndpointView], now: float | None = None) -> float:
        """The pool's saturation, as in the class docstring."""
        p = self.params
        oldest = (time.monotonic() if now is None else now) - self.staleness
        total = 0.0
        for v in endpoints:
            m = v.metrics
            if m.updated_at < oldest:
                total += 1.0
                continue
            total += max(m.waiting / p.queue_depth_threshold,
                         m.kv_usage / p.kv_cache_util_threshold)
        return total / len(endpoints)

    def probability(self, saturation: float) -> float:
        """The chance a sheddable request is rejected at ``saturation``."""
        return min(saturation ** self.params.power * self.params.k, 1.0)

    def admit(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        if request.priority >= 0 or not endpoints:
            return
        s = self.saturation(endpoints)
        prob = self.probability(s)
        if self.rng.random() < prob:
            raise Shed(f"probabilistic-admitter: rejected, saturation={s:.3f} prob={prob:.2f}")
