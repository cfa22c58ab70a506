"""``endpoint-attribute-filter`` (llm-d-router v0.10): keep endpoints whose numeric endpoint
attribute (a ``customMetrics`` gauge of ``core-metrics-extractor``) passes a threshold."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.plugins.scorer.endpoint_attribute_scorer import attribute_value
from epp.scheduling.request import LLMRequest

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "LessThan": operator.lt, "LessThanOrEqual": operator.le, "GreaterThan": operator.gt,
    "GreaterThanOrEqual": operator.ge, "Equal": operator.eq, "NotEqual": operator.ne,
}


@dataclass(frozen=True, slots=True)
class Threshold:
    """``operator`` and ``value`` (both required)."""

    operator: Literal["LessThan", "LessThanOrEqual", "GreaterThan", "GreaterThanOrEqual",
                      "Equal", "NotEqual", ""] = ""
    value: float | None = None


@dataclass(frozen=True, slots=True)
class FilterAlgorithm:
    """``type``: only ``threshold`` (upstream's other planned algorithms do not exist yet)."""

    type: Literal["threshold", ""] = ""
    threshold: Threshold | None = None


@dataclass(frozen=True, slots=True)
class EndpointAttributeFilterParameters:
    """``attribute`` (required), ``onMissing`` (``Pass``), ``fallbackOnEmpty`` (false),
    ``algorithm`` (required)."""

    attribute: str = ""
    on_missing: Literal["Pass", "Fail"] = "Pass"
    fallback_on_empty: bool = False
    algorithm: FilterAlgorithm = field(default_factory=FilterAlgorithm)

    def __post_init__(self) -> None:
        if not self.attribute:
            raise ValueError("attribute is required")
        if self.algorithm.type != "threshold":
            raise ValueError("algorithm.type is required and must be 'threshold'")
        t = self.algorithm.threshold
        if t is None or not t.operator or t.value is None:
            raise ValueError("algorithm.threshold needs operator and value")


class EndpointAttributeFilter(Filter):
    """keep e ⇔ v(e) ⟨operator⟩ threshold.value, where v(e) is the endpoint's attribute
    ``attribute``; an endpoint without it is kept with ``onMissing: Pass``, dropped with
    ``Fail``; none kept and ``fallbackOnEmpty`` → every candidate."""

    type_name = "endpoint-attribute-filter"
    parameters_type = EndpointAttributeFilterParameters
    params: EndpointAttributeFilterParameters

    def __init__(self, name: str = "", params: EndpointAttributeFilterParameters | None = None,
                 ) -> None:
        super().__init__(name, params)
        t = self.params.algorithm.threshold
        assert t is not None and t.value is not None  # checked by the parameters
        self._op, self._value = OPERATORS[t.operator], t.value
        self._keep_missing = self.params.on_missing == "Pass"

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        key = self.params.attribute
        kept = []
        for view in endpoints:
            value = attribute_value(view, key)
            if value is None:
                if self._keep_missing:
                    kept.append(view)
            elif self._op(value, self._value):
                kept.append(view)
        if not kept and self.params.fallback_on_empty:
            return endpoints
        return kept
