"""``core-metrics-extractor``: queue, running requests, KV-cache usage, LoRA adapters and
cache configuration from a ``/metrics`` page, in the endpoint's engine dialect (see the
table in :mod:`epp.metrics.dialects`).

The dialect, as upstream v1.5 chooses it: the pod's engine label, else ``defaultEngine``
(which upstream's chart sets from ``inferencePool.modelServerType``). Beyond upstream, a pod
*without* the label whose page lacks the default engine's load metrics is not marked
unhealthy: the page's own dialect is detected (:func:`epp.metrics.dialects.detect_engine`)
and remembered for that endpoint. A label is always obeyed: a wrong one stays an error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import structlog

from epp.datalayer.metrics_source import PROMETHEUS_TEXT
from epp.datalayer.plugin import Extractor
from epp.datastore import EndpointView, EngineType
from epp.datastore.models import ENGINE_TYPE_LABEL
from epp.metrics.dialects import MetricsError, ParsedMetrics, detect_engine, parse_metrics
from epp.scheduling.plugin import EndpointsRemoved, Plugin

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class CoreMetricsParameters:
    """``defaultEngine``: the dialect for pods without a (known) engine label;
    ``engineLabelKey``: the pod label naming the engine (upstream's names and defaults)."""

    default_engine: Literal["vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"] = "vllm"
    engine_label_key: str = ENGINE_TYPE_LABEL


class CoreMetricsExtractor(Plugin, Extractor, EndpointsRemoved):
    """dialect = the engine the pod's ``engineLabelKey`` label names, else ``defaultEngine``,
    else (unlabelled pods only) the dialect detected on the page; the page is read into
    :class:`epp.datastore.EndpointMetrics` by that dialect."""

    type_name = "core-metrics-extractor"
    parameters_type = CoreMetricsParameters
    input_type = PROMETHEUS_TEXT
    params: CoreMetricsParameters

    def __init__(self, name: str = "", params: CoreMetricsParameters | None = None) -> None:
        super().__init__(name, params)
        #: Unlabelled endpoints whose page turned out to be in another engine's dialect.
        self.detected: dict[str, EngineType] = {}

    def engine(self, view: EndpointView) -> EngineType:
        """The dialect ``view``'s page is read in."""
        raw = view.endpoint.labels.get(self.params.engine_label_key)
        if raw is None:
            return self.detected.get(view.key) or EngineType(self.params.default_engine)
        try:
            return EngineType(raw)
        except ValueError:
            return EngineType(self.params.default_engine)

    def extract(self, text: str, view: EndpointView, now: float) -> ParsedMetrics:
        engine = self.engine(view)
        try:
            return parse_metrics(text, engine, now)
        except MetricsError:
            if self.params.engine_label_key in view.endpoint.labels:
                raise
            found = detect_engine(text)
            if found is None or found == engine:
                raise
        parsed = parse_metrics(text, found, now)
        self.detected[view.key] = found
        log.info("unlabelled model server reads as another engine", endpoint=view.key,
                 engine=found.value, label=self.params.engine_label_key)
        return parsed

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        for key in [k for k in self.detected if k not in keys]:
            del self.detected[key]
