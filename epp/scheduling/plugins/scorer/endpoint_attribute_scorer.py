"""``endpoint-attribute-scorer`` (llm-d-router v0.10): rank endpoints by one numeric endpoint
attribute (a ``customMetrics`` gauge of ``core-metrics-extractor``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from epp.datalayer.custom_metrics import ScalarAttributes
from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class FixedRange:
    """``min`` < ``max``: the known bounds of the attribute."""

    min: float = 0.0
    max: float = 0.0


@dataclass(frozen=True, slots=True)
class Normalization:
    """At most one of ``adaptiveRange`` (``{}``; the default) or ``fixedRange``."""

    fixed_range: FixedRange | None = None
    adaptive_range: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.fixed_range is not None and self.adaptive_range is not None:
            raise ValueError("algorithm.normalization allows at most one strategy, got both "
                             "fixedRange and adaptiveRange")
        if self.adaptive_range:
            raise ValueError("algorithm.normalization.adaptiveRange takes no fields")
        fixed = self.fixed_range
        if fixed is not None and fixed.min >= fixed.max:
            raise ValueError(f"algorithm.normalization.fixedRange requires min < max, got "
                             f"min {fixed.min}, max {fixed.max}")


@dataclass(frozen=True, slots=True)
class ScorerAlgorithm:
    """``type`` (required) and ``normalization``."""

    type: Literal["linear_lower_is_better", "linear_higher_is_better", ""] = ""
    normalization: Normalization = field(default_factory=Normalization)


@dataclass(frozen=True, slots=True)
class EndpointAttributeScorerParameters:
    """``attributeKey`` (required) and ``algorithm``."""

    attribute_key: str = ""
    algorithm: ScorerAlgorithm = field(default_factory=ScorerAlgorithm)

    def __post_init__(self) -> None:
        if not self.attribute_key:
            raise ValueError("attributeKey is required")
        if not self.algorithm.type:
            raise ValueError("algorithm.type is required: linear_lower_is_better or "
                             "linear_higher_is_better")


def attribute_value(view: EndpointView, key: str) -> float | None:
    """The endpoint's custom attribute ``key`` (None when it has none)."""
    attrs = view.attribute(ScalarAttributes)
    return attrs.get(key) if attrs is not None else None


class EndpointAttributeScorer(Scorer):
    """n(e) = (v(e) - min) / (max - min), with [min, max] the range of v over the candidates
    having the attribute (``adaptiveRange``; all equal → 1) or ``fixedRange`` (n clamped to
    [0, 1]); score = 1 - n for ``linear_lower_is_better``, n for ``linear_higher_is_better``;
    an endpoint without the attribute scores 0."""

    type_name = "endpoint-attribute-scorer"
    parameters_type = EndpointAttributeScorerParameters
    params: EndpointAttributeScorerParameters
    bounded = True

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        key = self.params.attribute_key
        values = [attribute_value(v, key) for v in endpoints]
        lower = self.params.algorithm.type == "linear_lower_is_better"
        fixed = self.params.algorithm.normalization.fixed_range
        if fixed is not None:
            lo, hi = fixed.min, fixed.max
        else:
            present = [x for x in values if x is not None]
            if not present:
                return [0.0] * len(endpoints)
            lo, hi = min(present), max(present)
        scores = []
        for x in values:
            if x is None:
                scores.append(0.0)
            elif hi == lo:
                scores.append(1.0)
            else:
                n = min(1.0, max(0.0, (x - lo) / (hi - lo)))
                scores.append(1.0 - n if lower else n)
        return scores
