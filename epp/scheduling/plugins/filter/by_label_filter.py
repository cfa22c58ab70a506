"""llm-d's label filters under their older names: ``by-label`` (one label, a set of values)
and ``by-label-selector`` (the former name of ``label-selector-filter``). Both are deprecated
in llm-d and log a warning when configured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.plugins.filter.label_selector_filter import LabelSelectorFilter
from epp.scheduling.request import LLMRequest
from shared.plugins import Handle

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ByLabelParameters:
    """``label``: the pod label to read; ``validValues``: values that keep the endpoint;
    ``allowsNoLabel``: keep pods without the label."""

    label: str = ""
    valid_values: list[str] = field(default_factory=list)
    allows_no_label: bool = False

    def __post_init__(self) -> None:
        if not self.label:
            raise ValueError("label must not be empty")
        if not self.valid_values and not self.allows_no_label:
            raise ValueError("validValues must not be empty unless allowsNoLabel is true")


class ByLabelFilter(Filter):
    """Keeps an endpoint whose pod has ``label`` set to one of ``validValues`` (exact
    match), or has no such label when ``allowsNoLabel``."""

    type_name = "by-label"
    parameters_type = ByLabelParameters
    params: ByLabelParameters

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> ByLabelFilter:
        return cls(name, params)

    def filter(self, request: LLMRequest,
               endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        p = self.params
        valid = set(p.valid_values)
        out = []
        for v in endpoints:
            value = v.endpoint.labels.get(p.label)
            if (value is None and p.allows_no_label) or (value is not None and value in valid):
                out.append(v)
        return out


class ByLabelSelectorFilter(LabelSelectorFilter):
    """``label-selector-filter`` under its deprecated llm-d name."""

    type_name = "by-label-selector"

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> ByLabelSelectorFilter:
        return cls(name, params)
