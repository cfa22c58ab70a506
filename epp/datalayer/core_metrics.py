"""``core-metrics-extractor``: queue, running requests, KV-cache usage, LoRA adapters and
cache configuration from a ``/metrics`` page, in the endpoint's engine dialect (see the
table in :mod:`epp.metrics.dialects`).

The dialect, as upstream v1.5 chooses it: the pod's engine label, else ``defaultEngine``
(which upstream's chart sets from ``inferencePool.modelServerType``). Beyond upstream, a pod
*without* the label whose page lacks the default engine's load metrics is not marked
unhealthy: the page's own dialect is detected (:func:`epp.metrics.dialects.detect_engine`)
and remembered for that endpoint. A label is always obeyed: a wrong one stays an error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from epp.datalayer.custom_metrics import CustomMetric, CustomMetricsReader, publish_scalars
from epp.datalayer.metrics_source import PROMETHEUS_TEXT
from epp.datalayer.plugin import Extractor
from epp.datastore import EndpointView, EngineType
from epp.datastore.models import ENGINE_TYPE_LABEL
from epp.handle import EppHandle
from epp.metrics.dialects import (
    DIALECTS,
    Dialect,
    EngineSpecs,
    MetricsError,
    ParsedMetrics,
    detect_engine,
    dialect_from_specs,
    parse_metrics,
)
from epp.scheduling.plugin import EndpointsRemoved, Plugin
from shared.plugins import Handle

log = structlog.get_logger(__name__)

#: The reserved engine name upstream uses for "unlabelled pods".
DEFAULT_ENGINE = "default"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One ``engineConfigs`` entry (upstream's fields): the metric specifications of an
    engine, each a PromQL-style selector such as ``name{label=value}``; empty = not read."""

    name: str = ""
    queued_requests_spec: str = ""
    running_requests_spec: str = ""
    kv_usage_spec: str = ""
    lora_spec: str = ""
    cache_info_spec: str = ""
    cache_block_size_label_name: str = ""
    cache_num_blocks_label_name: str = ""
    cache_block_size_spec: str = ""
    cache_num_blocks_spec: str = ""
    #: llm-d-router v0.10: more gauges stored as numeric endpoint attributes.
    custom_metrics: list[CustomMetric] = field(default_factory=list)

    def __post_init__(self) -> None:
        keys = [m.attribute_key for m in self.custom_metrics]
        dup = {k for k in keys if keys.count(k) > 1}
        if dup:
            raise ValueError(f"engineConfigs {self.name!r}: customMetrics attributeKey "
                             f"{sorted(dup)[0]!r} is given twice")
        if not self.name:
            raise ValueError("engineConfigs: name must not be empty")
        if self.name == DEFAULT_ENGINE:
            raise ValueError(f"engineConfigs: name {DEFAULT_ENGINE!r} is reserved")

    def dialect(self) -> Dialect:
        try:
            return dialect_from_specs(self.name, EngineSpecs(
                queued=self.queued_requests_spec, running=self.running_requests_spec,
                kv_usage=self.kv_usage_spec, lora=self.lora_spec,
                cache_info=self.cache_info_spec,
                block_size_label=self.cache_block_size_label_name or "block_size",
                num_blocks_label=self.cache_num_blocks_label_name or "num_gpu_blocks",
                block_size=self.cache_block_size_spec, num_blocks=self.cache_num_blocks_spec))
        except ValueError as e:
            raise ValueError(f"engineConfigs {self.name!r}: {e}") from None


@dataclass(frozen=True, slots=True)
class CoreMetricsParameters:
    """``defaultEngine``: the dialect for pods without a (known) engine label;
    ``engineLabelKey``: the pod label naming the engine; ``engineConfigs``: metric
    specifications of more engines, or replacing a built-in one (upstream's names and
    defaults)."""

    default_engine: str = "vllm"
    engine_label_key: str = ENGINE_TYPE_LABEL
    engine_configs: list[EngineConfig] = field(default_factory=list)

    def __post_init__(self) -> None:
        names = [c.name for c in self.engine_configs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"engineConfigs: engine {sorted(dup)[0]!r} is given twice")
        known = {e.value for e in EngineType} | set(names)
        if self.default_engine not in known:
            raise ValueError(f"defaultEngine {self.default_engine!r} not found in "
                             f"engineConfigs (known: {', '.join(sorted(known))})")


class CoreMetricsExtractor(Plugin, Extractor, EndpointsRemoved):
    """dialect = the engine the pod's ``engineLabelKey`` label names, else ``defaultEngine``,
    else (unlabelled pods only) the dialect detected on the page; the page is read into
    :class:`epp.datastore.EndpointMetrics` by that dialect.

    The deprecated ``--*-metric`` flags replace families of the default engine's dialect
    (what unlabelled pods are read with), as they did upstream before ``engineConfigs``."""

    type_name = "core-metrics-extractor"
    parameters_type = CoreMetricsParameters
    input_type = PROMETHEUS_TEXT
    params: CoreMetricsParameters

    def __init__(self, name: str = "", params: Any = None,
                 default_override: Dialect | None = None) -> None:
        super().__init__(name, params)
        self.dialects: dict[str, Dialect] = {e.value: d for e, d in DIALECTS.items()}
        for config in self.params.engine_configs:
            self.dialects[config.name] = config.dialect()
        self.default = default_override or self.dialects[self.params.default_engine]
        #: engine name → its ``customMetrics`` reader (engines that declare some).
        self.custom: dict[str, CustomMetricsReader] = {
            c.name: CustomMetricsReader(c.custom_metrics)
            for c in self.params.engine_configs if c.custom_metrics}
        #: Unlabelled endpoints whose page turned out to be in another engine's dialect.
        self.detected: dict[str, Dialect] = {}

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> CoreMetricsExtractor:
        override = None
        if isinstance(handle, EppHandle) and handle.settings.metric_overrides:
            from epp.metrics.dialects import with_overrides

            base = cls(name, params).default
            override = with_overrides(base, handle.settings.metric_overrides)
        return cls(name, params, override)

    def dialect(self, view: EndpointView) -> Dialect:
        """The dialect ``view``'s page is read in."""
        raw = view.endpoint.labels.get(self.params.engine_label_key)
        if raw is None:
            return self.detected.get(view.key) or self.default
        return self.dialects.get(raw, self.default)

    def engine(self, view: EndpointView) -> EngineType | str:
        """The engine ``view``'s page is read as."""
        return self.dialect(view).engine

    def extract(self, text: str, view: EndpointView, now: float) -> ParsedMetrics:
        dialect = self.dialect(view)
        reader = self.custom.get(dialect.name)
        if reader is not None:
            # each scrape replaces the endpoint's custom attributes with what the page has
            publish_scalars(view, self.name, reader.read(text))
        try:
            return parse_metrics(text, dialect, now)
        except MetricsError:
            if self.params.engine_label_key in view.endpoint.labels:
                raise
            found = detect_engine(text)
            if found is None or found == dialect.engine:
                raise
        parsed = parse_metrics(text, found, now)
        self.detected[view.key] = DIALECTS[found]
        log.info("unlabelled model server reads as another engine", endpoint=view.key,
                 engine=found.value, label=self.params.engine_label_key)
        return parsed

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        for key in [k for k in self.detected if k not in keys]:
            del self.detected[key]
