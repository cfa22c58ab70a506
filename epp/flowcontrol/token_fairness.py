"""``token-fairness-policy`` (ours): fairness between tenants by the tokens the pool served
them, not by their request counts (a virtual token counter, after Sheng et al., "Fairness
in Serving Large Language Models", OSDI 2024).

Each tenant (fairness id) has a counter of weighted tokens served:

    cost = inputTokenWeight x (prompt - cached) + cachedTokenWeight x cached
           + outputTokenWeight x completion

charged as an estimate when a request is dispatched (its estimated prompt tokens, so a tenant
cannot take several turns before its first response ends) and corrected to the response's
exact ``usage`` when it completes. Among the tenants of a band with requests waiting, the one
with the smallest counter goes next (ties: the smaller fairness id). A tenant that comes back
after being idle (nothing waiting, nothing in flight) is lifted to the smallest counter of
the tenants that stayed busy, so idle time banks no credit for a later burst. With every
tenant backlogged, each receives an equal share of weighted tokens: a tenant sending 10x
longer prompts gets about a tenth of the requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from shared.plugins import Plugin

if TYPE_CHECKING:
    from epp.flowcontrol.queues import Band, FlowQueue

#: Forget idle tenants' counters every this many picks (those at or below the floor).
_SWEEP_EVERY = 1024


@dataclass(frozen=True, slots=True)
class TokenFairnessParameters:
    """Token weights (defaults: an output token costs 2 input tokens, a cached prompt token
    a tenth of one)."""

    input_token_weight: float = 1.0
    output_token_weight: float = 2.0
    cached_token_weight: float = 0.1

    def __post_init__(self) -> None:
        for name in ("input_token_weight", "output_token_weight", "cached_token_weight"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                    or v < 0:
                raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
        if self.input_token_weight == 0 and self.output_token_weight == 0:
            raise ValueError("inputTokenWeight and outputTokenWeight cannot both be 0")


class _Backlogged:
    __slots__ = ("ids", "picks")

    def __init__(self) -> None:
        self.ids: frozenset[str] = frozenset()
        self.picks = 0


class TokenFairness(Plugin):
    """Least weighted tokens served first (see the module docstring)."""

    type_name: ClassVar[str] = "token-fairness-policy"
    parameters_type = TokenFairnessParameters
    params: TokenFairnessParameters

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)
        #: Weighted tokens served per tenant (estimates for requests still in flight).
        self.counters: dict[str, float] = {}

    def new_state(self) -> _Backlogged:
        return _Backlogged()

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """Weighted tokens of one response."""
        p = self.params
        cached = min(max(cached_tokens, 0), prompt_tokens)
        return (p.input_token_weight * (prompt_tokens - cached)
                + p.cached_token_weight * cached + p.output_token_weight * completion_tokens)

    def pick(self, band: Band) -> FlowQueue | None:
        state: _Backlogged = band.fairness_state
        waiting = [fid for fid, f in band.flows.items() if f.length]
        if not waiting:
            state.ids = frozenset()
            return None
        counters = self.counters
        busy = [fid for fid in waiting if fid in state.ids or band.inflight.get(fid)]
        if busy:
            floor = min(counters.get(fid, 0.0) for fid in busy)
            for fid in waiting:
                if fid not in state.ids and not band.inflight.get(fid):
                    counters[fid] = max(counters.get(fid, 0.0), floor)  # no banked credit
        state.ids = frozenset(waiting)
        state.picks += 1
        if state.picks % _SWEEP_EVERY == 0:
            self._forget_idle(band, waiting)
        best = min(sorted(waiting), key=lambda fid: counters.get(fid, 0.0))
        return band.flows[best]

    # -- accounting (the flow controller calls these) ----------------------------------

    def started(self, fairness_id: str, prompt_tokens: int) -> None:
        """A request was dispatched: charge its estimated prompt now."""
        self.counters[fairness_id] = (self.counters.get(fairness_id, 0.0)
                                      + self.params.input_token_weight * prompt_tokens)

    def served(self, fairness_id: str, prompt_tokens: int, completion_tokens: int,
               cached_tokens: int, estimated_prompt_tokens: int) -> None:
        """Its response ended: replace the estimate with the exact ``usage`` (a response
        without usage keeps the estimate)."""
        if prompt_tokens == 0 and completion_tokens == 0:
            return
        exact = self.cost(prompt_tokens, completion_tokens, cached_tokens)
        estimate = self.params.input_token_weight * estimated_prompt_tokens
        self.counters[fairness_id] = self.counters.get(fairness_id, 0.0) + exact - estimate

    def _forget_idle(self, band: Band, waiting: list[str]) -> None:
        """Drop counters that the lift would replace anyway (idle, at or below the floor)."""
        if not waiting:
            return
        floor = min(self.counters.get(fid, 0.0) for fid in waiting)
        for fid in [fid for fid, c in self.counters.items()
                    if c <= floor and fid not in band.flows and not band.inflight.get(fid)]:
            del self.counters[fid]
