"""Figures over seeds: a median with a 95% bootstrap interval, and a verdict against a target.

A comparison runs every contender on the same seeds (same schedule, same fleet seed), so the
unit of evidence is the *paired ratio* of one seed: ``ours[seed] / baseline[seed]``. The
headline figure is the median of those ratios; its 95% interval comes from resampling the
seeds with replacement (percentile bootstrap of the median, fixed resampling seed so a report
is reproducible). With 5 seeds the interval is coarse on purpose: it can only be as sure as
five runs allow.

A target is **met** only when the whole interval is on the right side of it, **not met** when
the whole interval is on the wrong side, and **inconclusive** otherwise.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

RESAMPLES = 4000
LEVEL = 0.95
#: Student's t at 95% (two-sided) by degrees of freedom; 1.96 beyond.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


@dataclass(frozen=True, slots=True)
class Interval:
    """A median over seeds and its bootstrap interval (``lo`` <= ``median`` <= ``hi``)."""

    median: float
    lo: float
    hi: float
    n: int

    def __format__(self, spec: str) -> str:
        """``median [lo, hi]``, each number formatted by ``spec`` (two decimals by default)."""
        spec = spec or ".2f"
        return f"{self.median:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}]"

    def __str__(self) -> str:
        return format(self)


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, linear interpolation; 0 for none."""
    if not xs:
        return 0.0
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def bootstrap_median(values: Sequence[float], *, resamples: int = RESAMPLES,
                     level: float = LEVEL, seed: int = 0) -> Interval:
    """Median of ``values`` with a percentile-bootstrap interval of the median."""
    if not values:
        raise ValueError("no values to summarise")
    vals = list(values)
    rng = random.Random(seed)
    n = len(vals)
    meds = sorted(statistics.median(rng.choices(vals, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    return Interval(statistics.median(vals), quantile(meds, tail), quantile(meds, 1 - tail), n)


def paired_ratios(ours: dict[int, float], base: dict[int, float]) -> list[float]:
    """``ours[s] / base[s]`` for every seed both have (and where the base is positive)."""
    return [ours[s] / base[s] for s in sorted(ours.keys() & base.keys()) if base[s] > 0]


def geomean_interval(ratios: Sequence[float]) -> tuple[float, float]:
    """95% t-interval of the geometric mean of paired ratios (non-positive ones dropped);
    NaNs for fewer than two."""
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < 2:
        return (math.nan, math.nan)
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = T95.get(len(logs) - 1, 1.96) * sd / math.sqrt(len(logs))
    return math.exp(mean - half), math.exp(mean + half)


def verdict(iv: Interval, target: float, *, at_most: bool) -> str:
    """``met`` / ``not met`` / ``inconclusive`` for "ratio <= target" (``at_most``) or
    "ratio >= target"."""
    if at_most:
        if iv.hi <= target:
            return "met"
        return "not met" if iv.lo > target else "inconclusive"
    if iv.lo >= target:
        return "met"
    return "not met" if iv.hi < target else "inconclusive"
