"""``utilization-filter`` (llm-d-router v0.10): drop endpoints past any configured load cap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.request import LLMRequest
from shared.plugins import Handle

Metric = Literal["active-requests", "running-requests", "waiting-queue", "kv-cache-utilization"]


@dataclass(frozen=True, slots=True)
class UtilizationCondition:
    """One cap: an endpoint passes while ``metric`` ≤ ``maxValue``."""

    metric: Metric = "running-requests"
    max_value: float = -1.0

    def __post_init__(self) -> None:
        if self.max_value < 0:
            raise ValueError(f"conditions: {self.metric}: maxValue is required and must be "
                             f"non-negative")
        if self.metric == "kv-cache-utilization" and self.max_value > 1:
            raise ValueError("conditions: kv-cache-utilization: maxValue is a fraction, at "
                             "most 1")


@dataclass(frozen=True, slots=True)
class UtilizationFilterParameters:
    """``conditions`` (at least one), ``fallbackOnEmpty`` (default false),
    ``inFlightLoadProducerName`` (``active-requests`` only: the producer whose counts to read;
    default the ``inflight-load-producer`` of the config)."""

    conditions: list[UtilizationCondition] = field(default_factory=list)
    fallback_on_empty: bool = False
    in_flight_load_producer_name: str = ""

    def __post_init__(self) -> None:
        if not self.conditions:
            raise ValueError("conditions: at least one condition is required")


def metric_value(view: EndpointView, metric: str) -> float:
    """The endpoint's value of ``metric`` (0 before any scrape, as upstream treats missing)."""
    if metric == "active-requests":
        # the inflight-load producer's count: routed here by the EPP, not yet complete
        return float(view.inflight_requests)
    if metric == "running-requests":
        return float(view.metrics.running)
    if metric == "waiting-queue":
        return float(view.metrics.waiting)
    return view.metrics.kv_usage


class UtilizationFilter(Filter):
    """keep endpoint e ⇔ ∀ condition c: value(e, c.metric) ≤ c.maxValue.

    Values: ``active-requests`` = requests the EPP routed to e and has not seen complete
    (inflight-load-producer); ``running-requests``, ``waiting-queue``,
    ``kv-cache-utilization`` = the scraped model-server gauges. None kept and
    ``fallbackOnEmpty`` → every candidate."""

    type_name = "utilization-filter"
    parameters_type = UtilizationFilterParameters
    params: UtilizationFilterParameters

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> UtilizationFilter:
        wanted = params.in_flight_load_producer_name
        if wanted:
            from epp.requestcontrol.plugins.inflight_load import InflightLoadProducer

            # a typo stops the config; the counts themselves live on the endpoint views,
            # where the (always installed) producer keeps them
            handle.plugin(wanted, InflightLoadProducer)
        return cls(name, params)

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        conditions = self.params.conditions
        kept = [v for v in endpoints
                if all(metric_value(v, c.metric) <= c.max_value for c in conditions)]
        if not kept and self.params.fallback_on_empty:
            return endpoints
        return kept


__all__ = ["UtilizationCondition", "UtilizationFilter", "UtilizationFilterParameters"]
