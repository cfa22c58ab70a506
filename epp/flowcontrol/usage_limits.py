"""llm-d-router v0.10's priority-aware usage-limit policies (``usageLimitPolicyPluginRef``).

A usage-limit policy gives each band (highest priority first) a ceiling; a band dispatches
while the pool's saturation is below it, and the dispatch cycle stops at the first band that
may not (head-of-line blocking). Both policies here give lower bands lower ceilings, so
capacity above them stays free for higher bands.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from shared.plugins import Plugin


@dataclass(frozen=True, slots=True)
class PriorityHoldbackParameters:
    """``priority-holdback-policy`` parameters (upstream's names and defaults;
    ``minCeiling`` is required: there is no right default for how hard to gate)."""

    min_ceiling: float | None = None
    max_ceiling: float = 1.0
    shape: Literal["linear"] = "linear"
    domain: Literal["rank", "value"] = "rank"

    def __post_init__(self) -> None:
        lo, hi = self.min_ceiling, self.max_ceiling
        if lo is None:
            raise ValueError("minCeiling is required (the ceiling of the lowest priority)")
        if not (math.isfinite(lo) and 0.0 <= lo < 1.0):
            raise ValueError(f"minCeiling must be in [0.0, 1.0), got {lo!r}")
        if not (math.isfinite(hi) and 0.0 < hi <= 1.0):
            raise ValueError(f"maxCeiling must be in (0.0, 1.0], got {hi!r}")
        if lo >= hi:
            raise ValueError(f"minCeiling ({lo}) must be less than maxCeiling ({hi})")


class PriorityHoldback(Plugin):
    """Stepped ceilings from ``maxCeiling`` (highest band) to ``minCeiling`` (lowest).

    ``domain: rank``: c_i = max - i (max - min) / (N - 1), i = rank from the highest.
    ``domain: value``: c_i = min + (p_i - p_min) / (p_max - p_min) (max - min); all bands
    ``max`` when every priority is equal. One band: ``max``.
    """

    type_name: ClassVar[str] = "priority-holdback-policy"
    parameters_type = PriorityHoldbackParameters
    params: PriorityHoldbackParameters

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)

    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        lo = self.params.min_ceiling
        assert lo is not None
        hi = self.params.max_ceiling
        n = len(priorities)
        if n <= 1:
            return [hi] * n
        if self.params.domain == "rank":
            return [hi - i * (hi - lo) / (n - 1) for i in range(n)]
        p_max, p_min = priorities[0], priorities[-1]
        if p_max == p_min:
            return [hi] * n
        return [lo + (p - p_min) / (p_max - p_min) * (hi - lo) for p in priorities]


class SoftReflectiveCeiling(Plugin):
    """Ceilings that tighten with saturation s, no parameters (upstream v0.10's).

    Band 0 (highest): 1. Band i of N: its reflective ceiling is 1 - i s / (N - 1); below
    it the band is open (1). At s >= 1 it is closed (0). Otherwise it alternates: open on
    one call in ``round(s / (1 - s))`` while s >= 0.5 (one tick shared by every gated band, so
    the gated bands open and close together and a cycle never skips a closed band for an
    open lower one), closed below 0.5. The gated dispatch rate is then about (1 - s) / s.
    """

    type_name: ClassVar[str] = "soft-reflective-ceiling-policy"

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)
        self._tick = 0

    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        n = len(priorities)
        if n <= 1:
            return [1.0] * n
        s = saturation
        open_now = False
        if 1.0 - s <= s < 1.0:  # the alternating regime
            period = max(1, round(s / (1.0 - s + 1e-9)))
            self._tick += 1
            open_now = self._tick % period == 0
        out = [1.0]
        for i in range(1, n):
            if s < 1.0 - i * s / (n - 1):
                out.append(1.0)
            elif s >= 1.0:
                out.append(0.0)
            else:
                out.append(1.0 if open_now else 0.0)
        return out


USAGE_LIMIT_PLUGINS: tuple[type[Plugin], ...] = (PriorityHoldback, SoftReflectiveCeiling)
