"""``latency-scorer`` (upstream v1.5): rate candidates by predicted latency headroom
(SLO - predicted, from ``predicted-latency-producer``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from epp.datastore import EndpointView
from epp.latency.predictions import Prediction, predictions_of
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class LatencyScorerParameters:
    """Upstream names and defaults (upstream spells ``compositeKVWeight``)."""

    ALIASES: ClassVar[dict[str, str]] = {"compositeKVWeight": "composite_kv_weight"}

    ttft_weight: float = 0.8
    tpot_weight: float = 0.2
    headroom_selection_strategy: str = "least"
    composite_kv_weight: float = 1.0
    composite_queue_weight: float = 1.0
    composite_prefix_weight: float = 1.0

    def __post_init__(self) -> None:
        for field_name in ("ttft_weight", "tpot_weight", "composite_kv_weight",
                           "composite_queue_weight", "composite_prefix_weight"):
            if getattr(self, field_name) < 0:
                raise ValueError(f"{_camel(field_name)}: must be >= 0")
        if self.headroom_selection_strategy not in ("least", "most"):
            raise ValueError("headroomSelectionStrategy: must be 'least' or 'most', got "
                             f"{self.headroom_selection_strategy!r}")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


class LatencyScorer(Scorer):
    """With predictions for every candidate:

    * some meet the SLO (both headrooms ≥ 0): only those are scored, the rest get 0;
    * none does: idle candidates (nothing in flight from this EPP) first; otherwise the
      least-bad bucket only: TPOT-only misses, then TTFT-only, then both;
    * in the scored set, each headroom is normalised to [0, 1] — ``least``: closest to the
      SLO is best (bin-packing; without an SLO that is the lowest predicted latency),
      ``most``: most headroom is best (positive headroom only) — and blended
      (ttftWeight·nTTFT + tpotWeight·nTPOT) / (ttftWeight + tpotWeight); a dimension with no
      spread gives its weight to the other.

    Without predictions (model not trained yet): the composite fallback
    (kvW·(1 - kv) + queueW·(1 - q/max q) + prefixW·prefix) / (kvW + queueW + prefixW).
    """

    type_name = "latency-scorer"
    parameters_type = LatencyScorerParameters
    params: LatencyScorerParameters
    bounded = True

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        preds = predictions_of(request)
        found = [preds.by_endpoint.get(v.key) for v in endpoints] if preds else []
        if preds is None or not preds.predicted or any(p is None for p in found):
            prefix = preds.prefix_scores if preds is not None else {}
            return self.composite(endpoints, prefix)
        ps: list[Prediction] = [p for p in found if p is not None]
        n = len(ps)
        scored = [i for i in range(n) if ps[i].valid]
        positive = bool(scored)
        if not positive:
            idle = [i for i in range(n) if ps[i].dispatched == 0]
            scored = idle or self._least_bad(ps)
        return self._blend(ps, scored, positive)

    @staticmethod
    def _least_bad(ps: Sequence[Prediction]) -> list[int]:
        buckets: tuple[list[int], list[int], list[int]] = ([], [], [])
        for i, p in enumerate(ps):
            ttft_bad, tpot_bad = p.ttft_headroom < 0, p.tpot_headroom < 0
            buckets[0 if not ttft_bad else 1 if not tpot_bad else 2].append(i)
        return next(b for b in buckets if b)

    def _blend(self, ps: Sequence[Prediction], scored: list[int], positive: bool,
               ) -> list[float]:
        most = positive and self.params.headroom_selection_strategy == "most"
        ttft = self._normalise([ps[i].ttft_headroom for i in scored], most, positive)
        tpot = self._normalise([ps[i].tpot_headroom for i in scored], most, positive)
        wt, wp = self.params.ttft_weight, self.params.tpot_weight
        if ttft is None:
            wt = 0.0
        if tpot is None:
            wp = 0.0
        out = [0.0] * len(ps)
        total = wt + wp
        for j, i in enumerate(scored):
            if total == 0:
                out[i] = 1.0
            else:
                out[i] = ((wt * ttft[j] if ttft else 0.0)
                          + (wp * tpot[j] if tpot else 0.0)) / total
        return out

    @staticmethod
    def _normalise(hs: list[float], most: bool, positive: bool) -> list[float] | None:
        """[0, 1] per headroom, 1 = preferred; None when all are equal."""
        lo, hi = min(hs), max(hs)
        if hi == lo:
            return None
        span = hi - lo
        if most or not positive:  # most headroom, or (negative) closest to 0 = largest
            return [(h - lo) / span for h in hs]
        return [(hi - h) / span for h in hs]  # least positive headroom

    def composite(self, endpoints: Sequence[EndpointView], prefix: dict[str, float],
                  ) -> list[float]:
        p = self.params
        total = p.composite_kv_weight + p.composite_queue_weight + p.composite_prefix_weight
        if total == 0:
            return [1.0] * len(endpoints)
        max_q = max((v.queue for v in endpoints), default=0)
        return [(p.composite_kv_weight * (1.0 - min(v.metrics.kv_usage, 1.0))
                 + p.composite_queue_weight * (1.0 - v.queue / max_q if max_q else 1.0)
                 + p.composite_prefix_weight * prefix.get(v.key, 0.0)) / total
                for v in endpoints]
