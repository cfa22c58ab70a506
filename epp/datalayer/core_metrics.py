"""``core-metrics-extractor``: queue, running requests, KV-cache usage, LoRA adapters and
cache configuration from a ``/metrics`` page, in the endpoint's engine dialect (see the
table in :mod:`epp.metrics.dialects`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from epp.datalayer.metrics_source import PROMETHEUS_TEXT
from epp.datalayer.plugin import Extractor
from epp.datastore import EndpointView, EngineType
from epp.datastore.models import ENGINE_TYPE_LABEL
from epp.metrics.dialects import ParsedMetrics, parse_metrics
from epp.scheduling.plugin import Plugin


@dataclass(frozen=True, slots=True)
class CoreMetricsParameters:
    """``defaultEngine``: the dialect for pods without a (known) engine label;
    ``engineLabelKey``: the pod label naming the engine (upstream's names and defaults)."""

    default_engine: Literal["vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"] = "vllm"
    engine_label_key: str = ENGINE_TYPE_LABEL


class CoreMetricsExtractor(Plugin, Extractor):
    """dialect = the engine the pod's ``engineLabelKey`` label names, else ``defaultEngine``;
    the page is read into :class:`epp.datastore.EndpointMetrics` by that dialect."""

    type_name = "core-metrics-extractor"
    parameters_type = CoreMetricsParameters
    input_type = PROMETHEUS_TEXT
    params: CoreMetricsParameters

    def engine(self, view: EndpointView) -> EngineType:
        """The dialect ``view``'s page is read in."""
        raw = view.endpoint.labels.get(self.params.engine_label_key)
        try:
            return EngineType(raw) if raw is not None else EngineType(self.params.default_engine)
        except ValueError:
            return EngineType(self.params.default_engine)

    def extract(self, text: str, view: EndpointView, now: float) -> ParsedMetrics:
        return parse_metrics(text, self.engine(view), now)
