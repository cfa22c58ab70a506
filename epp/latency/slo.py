"""A request's latency SLO, from the headers upstream v1.5 defines (``x-slo-ttft-ms``,
``x-slo-tpot-ms``, milliseconds). Absent: no SLO. Present but not a finite number > 0: 400."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from shared.errors import BadRequest

TTFT_SLO_HEADER = "x-slo-ttft-ms"
TPOT_SLO_HEADER = "x-slo-tpot-ms"


class InvalidSLO(BadRequest):
    """400: an SLO header that is not a positive number of milliseconds."""

    code = "invalid_slo_header"


@dataclass(frozen=True, slots=True)
class SLO:
    """The request's targets in seconds (None: that target was not set)."""

    ttft: float | None = None
    tpot: float | None = None

    @property
    def any(self) -> bool:
        return self.ttft is not None or self.tpot is not None


NO_SLO = SLO()


def _seconds(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise InvalidSLO(f"{name} must be a number of milliseconds, got {raw!r}") from None
    if not math.isfinite(ms) or ms <= 0:
        raise InvalidSLO(f"{name} must be a finite number of milliseconds > 0, got {raw!r}")
    return ms / 1000.0


def parse_slo(headers: Mapping[str, str]) -> SLO:
    """The SLO ``headers`` carry; raises :class:`InvalidSLO` (400) for a bad value."""
    ttft, tpot = _seconds(headers, TTFT_SLO_HEADER), _seconds(headers, TPOT_SLO_HEADER)
    return NO_SLO if ttft is None and tpot is None else SLO(ttft, tpot)
