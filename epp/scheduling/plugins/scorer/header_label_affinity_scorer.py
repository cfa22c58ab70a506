"""``header-label-affinity-scorer`` (llm-d-router v0.10): prefer endpoints whose label equals
a request header (one instance per header→label mapping, each with its own weight)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class HeaderLabelAffinityParameters:
    """``headerName``: the request header holding the preferred value; ``labelKey``: the
    endpoint label compared with it (both required)."""

    header_name: str = ""
    label_key: str = ""

    def __post_init__(self) -> None:
        if not self.header_name.strip():
            raise ValueError("headerName is required")
        if not self.label_key.strip():
            raise ValueError("labelKey is required")


class HeaderLabelAffinityScorer(Scorer):
    """score(e) = 1 if labels(e)[labelKey] == header(headerName) else 0 (no header, or no
    such label: 0 everywhere)."""

    type_name = "header-label-affinity-scorer"
    parameters_type = HeaderLabelAffinityParameters
    params: HeaderLabelAffinityParameters
    bounded = True

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        # header names reach plugins lowercased, as Envoy hands them over
        wanted = request.headers.get(self.params.header_name.strip().lower())
        if not wanted:
            return [0.0] * len(endpoints)
        key = self.params.label_key
        return [1.0 if v.endpoint.labels.get(key) == wanted else 0.0 for v in endpoints]
