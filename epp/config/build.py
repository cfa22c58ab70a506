"""A validated :class:`EndpointPickerConfig` → a :class:`Runtime`: every plugin instantiated
through the registry with the EPP handle, the scheduler assembled, and each request-control
and data-layer extension point listed in call order.

System defaults, as upstream's loader adds them when a config is silent: the
``single-profile-handler``; ``max-score-picker`` in a profile without a picker (weight 1 for
scorers without one); the parsers ``openai-parser``, ``anthropic-parser`` and
``vllmhttp-parser`` (``openai-parser`` also takes every path the others do not claim);
``utilization-detector``; ``metrics-data-source`` with
``core-metrics-extractor`` when there is no ``dataLayer`` section; an
``approx-prefix-cache-producer`` for a ``prefix-cache-scorer`` without one. As llm-d v0.10, the
default metrics source is added beside a ``dataLayer`` section that lists none, unless
``dataLayer.injectDefaults: false``. Ours on top:
``inflight-load-producer`` and ``request-metrics-recorder`` (in-flight accounting and the
per-request metrics) always run, last among the pre-request and response-complete plugins.
With plugins but no profiles, one profile ``default`` uses every filter, scorer and picker.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from epp.config.builtins import builtin_registry
from epp.config.loader import (
    DEFAULT_PROFILE,
    ConfigError,
    EndpointPickerConfig,
    PluginRef,
    ProfileSpec,
    parse_config,
)
from epp.config.stability import warn_deprecated
from epp.datalayer import (
    CoreMetricsExtractor,
    DataSource,
    EndpointNotificationSource,
    Extractor,
    MetricsDataSource,
)
from epp.datalayer.endpoint_events import ENDPOINT_EVENTS
from epp.datastore import Datastore
from epp.flowcontrol import FEATURE_GATE as FLOW_CONTROL_GATE
from epp.flowcontrol import FlowControlConfig, FlowControlConfigError, FlowController
from epp.flowcontrol.admitter import FlowControlAdmitter, pool_saturation
from epp.flowcontrol.eviction import (
    ENGINE_RECLAIM_BUDGET,
    LEADING_SENSOR_GRACE,
    EvictionFilterPolicy,
    EvictionOrderingPolicy,
)
from epp.handle import EppHandle, Settings
from epp.requestcontrol.parser_chain import ParserChain
from epp.requestcontrol.plugin import (
    Admitter,
    DataProducer,
    FirstToken,
    Parser,
    PreRequest,
    RequestHeaderProcessor,
    ResponseComplete,
    ResponseMetadata,
    ResponseReceived,
    ResponseStreaming,
    SaturationDetector,
    Screener,
)
from epp.requestcontrol.plugins import (
    AnthropicParser,
    ConcurrencyDetector,
    InflightLoadProducer,
    OpenAIParser,
    P2PSourceProducer,
    RequestMetricsRecorder,
    UtilizationDetector,
    VllmHttpParser,
)
from epp.scheduling import (
    EndpointsRemoved,
    Filter,
    Picker,
    ProfileHandler,
    Scheduler,
    SchedulerHooks,
    SchedulingProfile,
    Scorer,
    WeightedScorer,
)
from epp.sources.file_discovery import FileDiscovery
from epp.statestore import StateStore
from shared.plugins import Plugin, PluginError, PluginRegistry

log = structlog.get_logger(__name__)
K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Runtime:
    """Everything one EPP runs with, built from one config."""

    config: EndpointPickerConfig
    handle: EppHandle
    scheduler: Scheduler
    parser: Parser
    producers: tuple[DataProducer, ...]
    saturation: SaturationDetector
    admitters: tuple[Admitter, ...]
    pre_request: tuple[PreRequest, ...]
    response_received: tuple[ResponseReceived, ...]
    first_token: tuple[FirstToken, ...]
    response_streaming: tuple[ResponseStreaming, ...]
    response_complete: tuple[ResponseComplete, ...]
    data_sources: tuple[DataSource, ...]
    rng: random.Random
    #: The flow controller when ``featureGates`` has ``flowControl`` (None: off, the default).
    flow_control: FlowController | None = None
    response_metadata: tuple[ResponseMetadata, ...] = ()
    #: Request-level candidate screens run before scheduling (llm-d-router v0.10).
    screeners: tuple[Screener, ...] = ()

    @property
    def datastore(self) -> Datastore:
        return self.handle.datastore

    @property
    def settings(self) -> Settings:
        return self.handle.settings

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        """Drop plugin state of endpoints no longer in the pool (every plugin that keeps
        some, scheduling or not)."""
        for plugin in self.handle.find(EndpointsRemoved):
            plugin.retain_endpoints(keys)


def build(
    config: EndpointPickerConfig | None = None,
    datastore: Datastore | None = None,
    settings: Settings | None = None,
    *,
    registry: PluginRegistry | None = None,
    rng: random.Random | None = None,
    hooks: SchedulerHooks | None = None,
    state_store: StateStore | None = None,
) -> Runtime:
    """Instantiate ``config`` (the default config when None); :class:`ConfigError` names the
    file, the place in it and the reason when it cannot be used. ``state_store`` is what the
    handle shares with plugins (a private in-memory store when None)."""
    config = config or parse_config(None)
    src = config.source
    registry = registry or builtin_registry()
    rng = rng or random.Random()
    handle = EppHandle(datastore, settings, state_store, rng)
    _instantiate(config, registry, handle)
    scheduler = _scheduler(config, registry, handle, rng, hooks)
    parser = _parser(config, registry, handle)
    saturation = _saturation(config, registry, handle)
    sources = _data_layer(config, registry, handle)
    flow = _flow_control(config, handle, saturation)
    _check_discovery(config, handle)
    _check_prefill_limit(config, handle, saturation, flow)
    sources += _endpoint_notifications(registry, handle, sources, src)
    for cls in (InflightLoadProducer, RequestMetricsRecorder):
        if not handle.find(cls):
            _default(registry, handle, cls.type_name, src)
    for p2p in handle.find(P2PSourceProducer):  # its producer exists once all plugins do
        try:
            p2p.check()
        except PluginError as e:
            raise ConfigError(f"{src}: plugin {p2p.name!r} ({p2p.type_name}): {e}") from None
    for plugin in handle:  # plugins added by defaults get the scheduler's hooks too
        if plugin not in scheduler.plugins and hasattr(plugin, "attach"):
            plugin.attach(scheduler.hooks.for_plugin(plugin.type_name, plugin.name))
    return Runtime(
        config=config, handle=handle, scheduler=scheduler, parser=parser,
        producers=_header_processors_first(handle.find(DataProducer)),
        saturation=saturation,
        admitters=tuple(handle.find(Admitter)), pre_request=_last(handle, PreRequest),
        response_received=tuple(handle.find(ResponseReceived)),
        first_token=tuple(handle.find(FirstToken)),
        response_streaming=tuple(handle.find(ResponseStreaming)),
        response_complete=_last(handle, ResponseComplete), data_sources=sources, rng=rng,
        flow_control=flow,
        response_metadata=tuple(handle.find(ResponseMetadata)),
        screeners=tuple(handle.find(Screener)),
    )


def build_scheduler(config: EndpointPickerConfig | None = None, *,
                    registry: PluginRegistry | None = None, rng: random.Random | None = None,
                    hooks: SchedulerHooks | None = None) -> Scheduler:
    """Only the scheduler of ``config`` (for tools and tests that schedule on their own)."""
    return build(config, registry=registry, rng=rng, hooks=hooks).scheduler


def build_saturation_detector(config: EndpointPickerConfig | None = None) -> Any:
    """Only the saturation detector of ``config``."""
    return build(config).saturation


# -- steps ---------------------------------------------------------------------------------


def _instantiate(config: EndpointPickerConfig, registry: PluginRegistry,
                 handle: EppHandle) -> None:
    """Every ``plugins`` entry, data producers and data-layer plugins first so that the
    plugins reading them find them through the handle."""
    def rank(spec: Any) -> int:
        cls = _type(registry, spec.type, spec.where or config.source)
        first = DataProducer | DataSource | Extractor | InflightLoadProducer
        return 0 if issubclass(cls, first) else 1

    for spec in sorted(config.plugins, key=rank):
        try:
            registry.create(spec.type, spec.name, spec.parameters, handle)
        except PluginError as e:
            raise ConfigError(f"{spec.where or config.source}: {e}") from None
        warn_deprecated(spec.type, spec.name, spec.where or config.source)


def _type(registry: PluginRegistry, type_name: str, where: str) -> type[Plugin]:
    try:
        return registry.get(type_name)
    except PluginError as e:
        raise ConfigError(f"{where}: {e}") from None


def _default(registry: PluginRegistry, handle: EppHandle, type_name: str, src: str,
             parameters: Mapping[str, Any] | None = None) -> Plugin:
    name = type_name if type_name not in handle else f"default/{type_name}"
    try:
        return registry.create(type_name, name, parameters, handle)
    except PluginError as e:
        raise ConfigError(f"{src}: {e}") from None


def _header_processors_first(found: list[DataProducer]) -> tuple[DataProducer, ...]:
    """Data producers in config order, request-header processors (``agent-identity``) first:
    the others may read the attributes they publish."""
    return (*[p for p in found if isinstance(p, RequestHeaderProcessor)],
            *[p for p in found if not isinstance(p, RequestHeaderProcessor)])


def _last(handle: EppHandle, kind: type[K]) -> tuple[K, ...]:
    """Plugins of ``kind``, with the in-flight accounting and metrics recorder last (so a
    failing user hook never leaves a count behind)."""
    found = handle.find(kind)
    own = [p for p in found if isinstance(p, InflightLoadProducer | RequestMetricsRecorder)]
    return (*[p for p in found if p not in own], *own)


def _parser(config: EndpointPickerConfig, registry: PluginRegistry,
            handle: EppHandle) -> Parser:
    src = config.source
    if config.parsers:
        chosen: list[Parser] = []
        for i, ref in enumerate(config.parsers):
            try:
                chosen.append(handle.plugin(ref, Parser))
            except PluginError as e:
                raise ConfigError(f"{src}: requestHandler.parsers[{i}].pluginRef: {e}") from None
        return chosen[0] if len(chosen) == 1 else ParserChain(chosen)
    if config.parser is not None:
        try:
            return handle.plugin(config.parser, Parser)
        except PluginError as e:
            raise ConfigError(f"{src}: parser.pluginRef: {e}") from None
    # Upstream v0.10's default list (openai, anthropic, vllmhttp), each the configured
    # instance when the plugins section has one. Ours: openai-parser also reads every path
    # nobody claims, as it did alone before (upstream fails such a request).
    chain: list[Parser] = []
    for kind in (OpenAIParser, AnthropicParser, VllmHttpParser):
        found = handle.find(kind)
        parser = found[0] if found else _default(registry, handle, kind.type_name, src)
        assert isinstance(parser, Parser)
        chain.append(parser)
    return ParserChain(chain, fallback=chain[0])


def _saturation(config: EndpointPickerConfig, registry: PluginRegistry,
                handle: EppHandle) -> SaturationDetector:
    src = config.source
    if config.saturation_ref is not None:
        try:
            return handle.plugin(config.saturation_ref, SaturationDetector)
        except PluginError as e:
            raise ConfigError(f"{src}: saturationDetector.pluginRef: {e}") from None
    found = handle.find(UtilizationDetector)
    if found and config.saturation_parameters:
        raise ConfigError(f"{src}: saturationDetector: thresholds given beside a configured "
                          f"utilization-detector; set them in its parameters")
    if found:
        return found[0]
    try:
        detector = _default(registry, handle, UtilizationDetector.type_name, src,
                            config.saturation_parameters)
    except ConfigError as e:
        raise ConfigError(str(e).replace("plugin 'utilization-detector'",
                                         "saturationDetector")) from None
    assert isinstance(detector, SaturationDetector)
    return detector


def _flow_control(config: EndpointPickerConfig, handle: EppHandle,
                  saturation: SaturationDetector) -> FlowController | None:
    """With the ``flowControl`` gate: the controller (over the ``flowControl`` section, or
    upstream's defaults) and its admitter. Without the gate the section is only validated,
    as upstream ignores it then."""
    enabled = (FLOW_CONTROL_GATE in config.feature_gates and config.flow_control is not None
               and config.flow_control.enable_eviction)
    for p in handle:
        if isinstance(p, EvictionFilterPolicy | EvictionOrderingPolicy) and not enabled:
            raise ConfigError(
                f"{config.source}: plugin {p.name!r} ({p.type_name}) is used only by in-flight "
                f"eviction: set flowControl.enableEviction: true (with featureGates: "
                f"[flowControl]) or remove it")
    if FLOW_CONTROL_GATE not in config.feature_gates:
        return None
    try:
        controller = FlowController(
            config.flow_control or FlowControlConfig(),
            pool_saturation(saturation, handle.datastore),
            plugins={p.name: p for p in handle},
            pool_endpoints=lambda: len(handle.datastore.candidates()),
            eviction_grace=_eviction_grace(saturation, handle.settings))
    except FlowControlConfigError as e:
        raise ConfigError(f"{config.source}: {e}") from None
    handle.add(FlowControlAdmitter(controller))
    return controller


def _eviction_grace(saturation: SaturationDetector, settings: Settings) -> float:
    """How long an eviction's freed capacity takes to show in ``saturation`` (upstream
    v0.10 derives it the same way): ``concurrency-detector`` counts streams itself, so a few
    milliseconds; a scraped detector needs a scrape, the staleness window and the engine's
    abort."""
    if isinstance(saturation, ConcurrencyDetector):
        return LEADING_SENSOR_GRACE
    return settings.scraper.interval + settings.staleness + ENGINE_RECLAIM_BUDGET


def _check_discovery(config: EndpointPickerConfig, handle: EppHandle) -> None:
    """``dataLayer.discovery`` names a discovery plugin, and a discovery plugin is named
    (one nobody names would do nothing; upstream ignores it, here it is refused)."""
    src = config.source
    if config.discovery is not None:
        try:
            handle.plugin(config.discovery, FileDiscovery)
        except PluginError as e:
            raise ConfigError(f"{src}: dataLayer.discovery.pluginRef: {e}") from None
    for plugin in handle.find(FileDiscovery):
        if plugin.name != config.discovery:
            raise ConfigError(f"{src}: plugin {plugin.name!r} (file-discovery) does nothing "
                              f"unless dataLayer.discovery.pluginRef names it")


def _check_prefill_limit(config: EndpointPickerConfig, handle: EppHandle,
                         saturation: SaturationDetector, flow: FlowController | None) -> None:
    """``maxPrefillConcurrency`` holds requests back for a moment (until a first token), so
    it needs flow control with that detector as the dispatch signal: as a filter alone it
    would refuse every request arriving while each endpoint is at its prefill limit."""
    for plugin in handle.find(ConcurrencyDetector):
        if plugin.params.max_prefill_concurrency is None:
            continue
        if flow is None or plugin is not saturation:
            raise ConfigError(
                f"{config.source}: plugin {plugin.name!r}: maxPrefillConcurrency needs flow "
                f"control (featureGates: [flowControl]) with this plugin as "
                f"saturationDetector.pluginRef, so requests wait for a first token instead "
                f"of being refused")


def _data_layer(config: EndpointPickerConfig, registry: PluginRegistry,
                handle: EppHandle) -> tuple[DataSource, ...]:
    src = config.source
    specs = config.data_layer
    if "enableLegacyMetrics" in config.feature_gates or (
            specs is None and config.inject_defaults):
        source = next(iter(handle.find(MetricsDataSource)), None) or _default(
            registry, handle, MetricsDataSource.type_name, src)
        extractor = next(iter(handle.find(CoreMetricsExtractor)), None) or _default(
            registry, handle, CoreMetricsExtractor.type_name, src)
        assert isinstance(source, MetricsDataSource) and isinstance(extractor, Extractor)
        source.extractors = [extractor]
        return (source,)
    sources: list[DataSource] = []
    for i, spec in enumerate(specs or ()):
        where = f"{src}: dataLayer.sources[{i}]"
        try:
            found = handle.plugin(spec.plugin_ref, DataSource)
            if found in sources:
                raise PluginError(f"plugin {spec.plugin_ref!r} is listed twice")
            found.extractors = []
            for ref in spec.extractors:
                found.add_extractor(handle.plugin(ref, Extractor))
        except (PluginError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from None
        if not found.extractors and not isinstance(found, MetricsDataSource):
            raise ConfigError(f"{where}.extractors: {spec.plugin_ref} does nothing without "
                              f"an extractor; name at least one")
        if isinstance(found, MetricsDataSource) and not any(
                isinstance(e, CoreMetricsExtractor) for e in found.extractors):
            raise ConfigError(f"{where}.extractors: {spec.plugin_ref} needs a "
                              f"core-metrics-extractor")
        sources.append(found)
    if config.inject_defaults and not any(isinstance(s, MetricsDataSource) for s in sources):
        # llm-d v0.10 adds the default metrics source beside the listed ones (opt out with
        # injectDefaults: false), reusing configured instances of the two types.
        source = next((s for s in handle.find(MetricsDataSource)), None) or _default(
            registry, handle, MetricsDataSource.type_name, src)
        extractor = next(iter(handle.find(CoreMetricsExtractor)), None) or _default(
            registry, handle, CoreMetricsExtractor.type_name, src)
        assert isinstance(source, MetricsDataSource) and isinstance(extractor, Extractor)
        source.extractors = [extractor]
        sources.append(source)
    return tuple(sources)


def _endpoint_notifications(registry: PluginRegistry, handle: EppHandle,
                            sources: tuple[DataSource, ...], src: str) -> tuple[DataSource, ...]:
    """An ``endpoint-notification-source`` for endpoint extractors no source feeds (llm-d
    configs without a ``dataLayer`` wiring for ``precise-prefix-cache-scorer``)."""
    wired = {id(e) for s in sources for e in s.extractors}
    orphans = [e for e in handle.find(Extractor)
               if e.input_type == ENDPOINT_EVENTS and id(e) not in wired]
    if not orphans:
        return ()
    source = next((s for s in handle.find(EndpointNotificationSource) if s not in sources),
                  None) or _default(registry, handle, EndpointNotificationSource.type_name, src)
    assert isinstance(source, EndpointNotificationSource)
    for extractor in orphans:
        source.add_extractor(extractor)
    return (source,)


def _scheduler(config: EndpointPickerConfig, registry: PluginRegistry, handle: EppHandle,
               rng: random.Random, hooks: SchedulerHooks | None) -> Scheduler:
    src = config.source
    handlers = handle.find(ProfileHandler)
    if len(handlers) > 1:
        raise ConfigError(f"{src}: plugins: more than one profile handler: "
                          + ", ".join(h.name for h in handlers))
    handler = handlers[0] if handlers else _default(
        registry, handle, "single-profile-handler", src)
    assert isinstance(handler, ProfileHandler)
    specs = config.profiles or (ProfileSpec(DEFAULT_PROFILE, tuple(
        PluginRef(s.name) for s in config.plugins
        if isinstance(handle.plugin(s.name, Plugin), Filter | Scorer | Picker))),)
    default_picker: Picker | None = None
    profiles: list[SchedulingProfile] = []
    for pspec in specs:
        filters, scorers, picker = _profile_plugins(pspec, handle, src)
        if picker is None:
            if default_picker is None:
                created = _default(registry, handle, "max-score-picker", src)
                assert isinstance(created, Picker)
                default_picker = created
            picker = default_picker
        if not scorers and picker.type_name == "max-score-picker":
            # Upstream's loader builds the same profile and says nothing; a config that lists
            # only, say, an admitter then routes at random, which nobody means.
            log.warning("scheduling profile has no scorer: every endpoint ties and "
                        "max-score-picker picks at random", profile=pspec.name, where=src,
                        hint="list scorers, e.g. the default config's queue-scorer, "
                             "kv-cache-utilization-scorer and prefix-cache-scorer")
        profiles.append(SchedulingProfile(pspec.name, picker, filters, scorers))
    try:
        return Scheduler(profiles, handler, plugins=list(handle), rng=rng, hooks=hooks)
    except ValueError as e:
        raise ConfigError(f"{src}: schedulingProfiles: {e}") from None


def _profile_plugins(pspec: ProfileSpec, handle: EppHandle, src: str,
                     ) -> tuple[list[Filter], list[WeightedScorer], Picker | None]:
    where = f"{src}: schedulingProfiles: {pspec.name}"
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    picker: Picker | None = None
    for ref in pspec.plugins:
        plugin = handle.plugin(ref.plugin_ref, Plugin)
        used = False
        if isinstance(plugin, Filter):
            filters.append(plugin)
            used = True
        if isinstance(plugin, Scorer):
            scorers.append(WeightedScorer(plugin, 1.0 if ref.weight is None else ref.weight))
            used = True
        if isinstance(plugin, Picker):
            if picker is not None:
                raise ConfigError(f"{where}: two pickers ({picker.name}, {plugin.name}); use one")
            picker = plugin
            used = True
        if not used and isinstance(plugin, DataProducer):
            used = True  # upstream lists producers in profiles; they run before scheduling
        if not used:
            raise ConfigError(f"{where}: plugin {plugin.name!r} ({plugin.type_name}) is not a "
                              f"filter, scorer or picker")
    return filters, scorers, picker
