"""``label-selector-filter``: keep endpoints whose pod labels match a selector."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class LabelSelectorParameters:
    """``matchLabels``: every label must be present with this value.

    ``matchExpressions``: Kubernetes set-based requirements
    (``{key, operator: In|NotIn|Exists|DoesNotExist, values}``).
    """

    match_labels: dict[str, str] = field(default_factory=dict)
    match_expressions: list[dict[str, object]] = field(default_factory=list)


class LabelSelectorFilter(Filter):
    """Keeps an endpoint when its pod's labels satisfy ``matchLabels`` and
    ``matchExpressions`` (both; an empty selector keeps everything)."""

    type_name = "label-selector-filter"
    parameters_type = LabelSelectorParameters
    params: LabelSelectorParameters

    def __init__(self, name: str = "", params: LabelSelectorParameters | None = None) -> None:
        super().__init__(name, params)
        for expr in self.params.match_expressions:
            op = expr.get("operator")
            if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
                raise ValueError(f"matchExpressions operator must be In, NotIn, Exists or "
                                 f"DoesNotExist, got {op!r}")

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        return [v for v in endpoints if self.matches(v.endpoint.labels)]

    def matches(self, labels: dict[str, str]) -> bool:
        """True when ``labels`` satisfy the selector."""
        for k, want in self.params.match_labels.items():
            if labels.get(k) != want:
                return False
        for expr in self.params.match_expressions:
            key = str(expr.get("key", ""))
            op = expr.get("operator")
            raw_values = expr.get("values")
            values = [str(x) for x in raw_values] if isinstance(raw_values, list) else []
            present = key in labels
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
            if op == "In" and labels.get(key) not in values:
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
        return True
