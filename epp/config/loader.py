"""``EndpointPickerConfig`` YAML → a validated :class:`EndpointPickerConfig` (no plugins
instantiated yet; :func:`epp.config.build` does that).

Every top-level section upstream v1.5 defines is read, strictly: an unknown key anywhere is
an error naming the file and the path (``config.yaml: dataLayer.sources[0].extractor``)::

    apiVersion: inference.networking.x-k8s.io/v1alpha1   # or llm-d.ai/v1alpha1
    kind: EndpointPickerConfig
    featureGates: [dataLayer]
    plugins:
    - type: queue-scorer                    # name defaults to the type
    - type: metrics-data-source
      parameters: {scheme: https}
    - type: core-metrics-extractor
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: queue-scorer
        weight: 2
    requestHandler:                         # llm-d v0.10; ``parser:`` is its older form
      parsers: [{pluginRef: openai-parser}] # first parser claiming the path wins
    dataLayer:
      sources:
      - pluginRef: metrics-data-source
        extractors: [{pluginRef: core-metrics-extractor}]
      discovery: {pluginRef: file-discovery} # endpoints from a plugin, not Kubernetes
      injectDefaults: true                   # false: no default metrics source
      crossReplicaSyncerPluginRef: ...       # refused: no syncer type exists (upstream neither)
      crossReplicaSyncInterval: 200ms
    saturationDetector: {pluginRef: utilization-detector}
    flowControl: {...}                      # used with featureGates: [flowControl]
"""

from __future__ import annotations

import math
from argparse import ArgumentTypeError
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog
import yaml

from epp.flowcontrol.config import FlowControlConfig, FlowControlConfigError
from shared.flags import duration

log = structlog.get_logger(__name__)

API_VERSIONS: Final = ("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1")
KIND: Final = "EndpointPickerConfig"
SECTIONS: Final = ("apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles",
                   "parser", "requestHandler", "dataLayer", "flowControl", "saturationDetector")
#: Keys of ``dataLayer`` (llm-d v0.10's ``DataLayerConfig``).
DATA_LAYER_KEYS: Final = ("sources", "discovery", "injectDefaults",
                          "crossReplicaSyncerPluginRef", "crossReplicaSyncInterval")
#: Feature gates upstream v1.5 registers, plus ``prepareDataPlugins`` (v1.1-v1.3).
#: ``dataLayer`` and ``prepareDataPlugins`` are always on here; ``enableLegacyMetrics``
#: ignores the ``dataLayer`` section and scrapes as the flags say; ``flowControl`` turns on
#: flow control (:mod:`epp.flowcontrol`) with the ``flowControl`` section.
FEATURE_GATES: Final = frozenset(
    {"dataLayer", "enableLegacyMetrics", "flowControl", "prepareDataPlugins"})
DEFAULT_PROFILE: Final = "default"
#: Upstream's default profile plus ours, ``prefill-load-scorer`` (docs/epp.md, "The default
#: profile": it is where our defaults and upstream's differ).
DEFAULT_CONFIG_YAML: Final = f"""\
apiVersion: {API_VERSIONS[0]}
kind: {KIND}
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: prefill-load-scorer
schedulingProfiles:
- name: {DEFAULT_PROFILE}
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: prefill-load-scorer
    weight: 1
"""
#: The legacy ``saturationDetector`` keys (v1.0-v1.3): thresholds of the utilization
#: detector, written straight into the section.
_LEGACY_SATURATION: Final = frozenset(
    {"queueDepthThreshold", "kvCacheUtilThreshold", "metricsStalenessThreshold"})


class ConfigError(ValueError):
    """The EndpointPickerConfig cannot be used; the message says where (file, path) and why."""


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """One entry of ``plugins``."""

    name: str
    type: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    #: Where it was written (``file: plugins[2]``), for errors found while building.
    where: str = ""


@dataclass(frozen=True, slots=True)
class PluginRef:
    """One entry of a profile's ``plugins``; ``weight`` only matters for scorers."""

    plugin_ref: str
    weight: float | None = None


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """One entry of ``schedulingProfiles``."""

    name: str
    plugins: tuple[PluginRef, ...]


@dataclass(frozen=True, slots=True)
class DataSourceSpec:
    """One entry of ``dataLayer.sources``: a data-source plugin and its extractors."""

    plugin_ref: str
    extractors: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EndpointPickerConfig:
    """A parsed, validated EndpointPickerConfig (plugins not yet instantiated)."""

    plugins: tuple[PluginSpec, ...]
    profiles: tuple[ProfileSpec, ...]
    feature_gates: tuple[str, ...] = ()
    #: ``parser.pluginRef`` (None: the default ``openai-parser``); upstream v0.10 deprecates
    #: it for ``requestHandler.parsers``, which wins when both are given.
    parser: str | None = None
    #: ``requestHandler.parsers`` in order (the first parser claiming a request's path
    #: parses it; one claiming no path takes the rest). Empty: ``parser`` or the default.
    parsers: tuple[str, ...] = ()
    #: ``dataLayer.sources``; None when the section is absent (the defaults then apply),
    #: empty when it is given empty (no metrics are collected).
    data_layer: tuple[DataSourceSpec, ...] | None = None
    #: ``dataLayer.discovery.pluginRef``: the plugin that lists the endpoints instead of
    #: the Kubernetes API (or ``--manifests``); None: those.
    discovery: str | None = None
    #: ``dataLayer.injectDefaults`` (default true): false stops the default
    #: ``metrics-data-source`` + ``core-metrics-extractor`` being added.
    inject_defaults: bool = True
    #: ``dataLayer.crossReplicaSyncInterval`` in seconds (None: not given).
    cross_replica_sync_interval: float | None = None
    #: ``saturationDetector.pluginRef`` (None: the default ``utilization-detector``).
    saturation_ref: str | None = None
    #: Legacy ``saturationDetector`` thresholds (parameters of the default detector).
    saturation_parameters: Mapping[str, Any] = field(default_factory=dict)
    #: The ``flowControl`` section (None when absent); used only with the ``flowControl``
    #: feature gate, as upstream.
    flow_control: FlowControlConfig | None = None
    #: The file (or ``--config-text``) it came from; every error message starts with it.
    source: str = "config"


def parse_duration(value: Any, where: str) -> float:
    """A Go duration (``200ms``, ``1m30s``) or a number of seconds → seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return duration(value)
        except ArgumentTypeError:
            pass
    raise ConfigError(f"{where}: must be a duration like 200ms, got {value!r}")


def _mapping(value: Any, where: str, keys: tuple[str, ...] | frozenset[str] | None = None,
             ) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: must be a mapping, got {type(value).__name__}")
    if keys is not None:
        for key in value:
            if key not in keys:
                raise ConfigError(f"{where}: unknown field {key!r} (known: {', '.join(keys)})")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where}: must be a list, got {type(value).__name__}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: must be a non-empty string, got {value!r}")
    return value


def _count(value: Any, where: str) -> int | None:
    """A Kubernetes quantity written as a plain count (``1000``, ``"64Mi"``)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
                 "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
        for unit, mult in units.items():
            if value.endswith(unit) and value[: -len(unit)].isdigit():
                return int(value[: -len(unit)]) * mult
        if value.isdigit():
            return int(value)
    raise ConfigError(f"{where}: must be a quantity like 1000 or 64Mi, got {value!r}")


def parse_config(text: str | None, *, source: str = "config") -> EndpointPickerConfig:
    """Parse EndpointPickerConfig YAML (None or blank = the default config)."""
    if text is None or not text.strip():
        text = DEFAULT_CONFIG_YAML
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {' '.join(str(e).split())}") from None
    top = _mapping(doc, source)
    for key in top:
        if key not in SECTIONS:
            raise ConfigError(f"{source}: {key}: unknown section (known: {', '.join(SECTIONS)})")
    api = top.get("apiVersion")
    if api is not None and api not in API_VERSIONS:
        raise ConfigError(
            f"{source}: apiVersion: must be one of {', '.join(API_VERSIONS)}, got {api!r}"
        )
    if api == API_VERSIONS[0] and text is not DEFAULT_CONFIG_YAML:
        log.warning("config group is deprecated (llm-d v0.10)", where=f"{source}: apiVersion",
                    use=API_VERSIONS[1])
    if "parser" in top:
        log.warning("config section is deprecated (llm-d v0.10)", where=f"{source}: parser",
                    use="requestHandler.parsers")
    kind = top.get("kind")
    if kind is not None and kind != KIND:
        raise ConfigError(f"{source}: kind: must be {KIND}, got {kind!r}")

    plugins = _plugins(top.get("plugins"), source)
    names = {p.name for p in plugins}
    gates = _gates(top.get("featureGates"), source)
    flow = _flow_control(top.get("flowControl"), source, names)
    ref, params = _saturation(top.get("saturationDetector"), source, names)
    if flow is not None and flow.saturation_detector_ref is not None:
        ref = flow.saturation_detector_ref  # v0.10: it wins over the top-level section
    layer = _mapping(top.get("dataLayer"), f"{source}: dataLayer", DATA_LAYER_KEYS)
    inject = layer.get("injectDefaults", True)
    if not isinstance(inject, bool):
        raise ConfigError(f"{source}: dataLayer.injectDefaults: must be true or false, "
                          f"got {inject!r}")
    interval = layer.get("crossReplicaSyncInterval")
    if interval is not None:
        # Read by a cross-replica syncer only (v0.10 ships none, and its ref is refused here),
        # so it does nothing: said once, as the config loads.
        log.warning("dataLayer.crossReplicaSyncInterval has no effect without a cross-replica "
                    "syncer; active-active replicas share state through --state-store",
                    where=f"{source}: dataLayer.crossReplicaSyncInterval")
    return EndpointPickerConfig(
        plugins=plugins,
        profiles=_profiles(top.get("schedulingProfiles"), source, names),
        feature_gates=gates,
        parser=_ref(top.get("parser"), f"{source}: parser", names),
        parsers=_parsers(top.get("requestHandler"), source, names),
        data_layer=_data_layer(top, source, names),
        discovery=_ref(layer.get("discovery"), f"{source}: dataLayer.discovery", names),
        inject_defaults=inject,
        cross_replica_sync_interval=None if interval is None else parse_duration(
            interval, f"{source}: dataLayer.crossReplicaSyncInterval"),
        saturation_ref=ref,
        saturation_parameters=params,
        flow_control=flow,
        source=source,
    )


def _plugins(raw: Any, source: str) -> tuple[PluginSpec, ...]:
    out: list[PluginSpec] = []
    names: set[str] = set()
    for i, p in enumerate(_list(raw, f"{source}: plugins")):
        where = f"{source}: plugins[{i}]"
        p = _mapping(p, where, ("name", "type", "parameters"))
        ptype = _str(p.get("type"), f"{where}.type")
        name = _str(p.get("name", ptype), f"{where}.name")
        if name in names:
            raise ConfigError(f"{where}.name: plugin name {name!r} is used twice")
        names.add(name)
        params = _mapping(p.get("parameters"), f"{where}.parameters")
        out.append(PluginSpec(name=name, type=ptype, parameters=params, where=where))
    return tuple(out)


def _profiles(raw: Any, source: str, names: set[str]) -> tuple[ProfileSpec, ...]:
    out: list[ProfileSpec] = []
    for i, prof in enumerate(_list(raw, f"{source}: schedulingProfiles")):
        where = f"{source}: schedulingProfiles[{i}]"
        prof = _mapping(prof, where, ("name", "plugins"))
        pname = _str(prof.get("name"), f"{where}.name")
        if any(p.name == pname for p in out):
            raise ConfigError(f"{where}.name: profile name {pname!r} is used twice")
        refs: list[PluginRef] = []
        for j, ref in enumerate(_list(prof.get("plugins"), f"{where}.plugins")):
            rwhere = f"{where}.plugins[{j}]"
            ref = _mapping(ref, rwhere, ("pluginRef", "weight"))
            target = _str(ref.get("pluginRef"), f"{rwhere}.pluginRef")
            if target not in names:
                raise ConfigError(f"{rwhere}.pluginRef: no plugin named {target!r} in plugins")
            w = ref.get("weight")
            # An infinite weight would make every total score inf or nan (inf x 0), and the
            # picker would find no best endpoint: refused here, like a negative one.
            if w is not None and (
                isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w < math.inf
            ):
                raise ConfigError(f"{rwhere}.weight: must be a finite number >= 0, got {w!r}")
            refs.append(PluginRef(target, None if w is None else float(w)))
        out.append(ProfileSpec(pname, tuple(refs)))
    return tuple(out)


def _gates(raw: Any, source: str) -> tuple[str, ...]:
    gates = []
    for i, g in enumerate(_list(raw, f"{source}: featureGates")):
        gate = _str(g, f"{source}: featureGates[{i}]")
        if gate not in FEATURE_GATES:
            raise ConfigError(f"{source}: featureGates[{i}]: unknown feature gate {gate!r} "
                              f"(known: {', '.join(sorted(FEATURE_GATES))})")
        gates.append(gate)
    return tuple(gates)


def _ref(raw: Any, where: str, names: set[str]) -> str | None:
    """A ``{pluginRef: name}`` section; None when absent."""
    if raw is None:
        return None
    section = _mapping(raw, where, ("pluginRef",))
    ref = _str(section.get("pluginRef"), f"{where}.pluginRef")
    if ref not in names:
        raise ConfigError(f"{where}.pluginRef: no plugin named {ref!r} in plugins")
    return ref


def _data_layer(top: Mapping[str, Any], source: str,
                names: set[str]) -> tuple[DataSourceSpec, ...] | None:
    if "dataLayer" not in top:
        return None
    where = f"{source}: dataLayer"
    section = _mapping(top["dataLayer"], where, DATA_LAYER_KEYS)
    syncer = section.get("crossReplicaSyncerPluginRef")
    if syncer is not None:
        _str(syncer, f"{where}.crossReplicaSyncerPluginRef")
        if syncer not in names:
            raise ConfigError(f"{where}.crossReplicaSyncerPluginRef: no plugin named "
                              f"{syncer!r} in plugins")
        # Upstream v0.10 defines the reference but ships no plugin type that is a syncer
        # (only a test double), so every in-tree type is refused there too.
        raise ConfigError(f"{where}.crossReplicaSyncerPluginRef: plugin {syncer!r} is not a "
                          f"cross-replica syncer (no built-in type is one; replicas share "
                          f"routing state through --state-store, docs/active-active.md)")
    out: list[DataSourceSpec] = []
    for i, s in enumerate(_list(section.get("sources"), f"{where}.sources")):
        swhere = f"{where}.sources[{i}]"
        s = _mapping(s, swhere, ("pluginRef", "extractors"))
        ref = _str(s.get("pluginRef"), f"{swhere}.pluginRef")
        if ref not in names:
            raise ConfigError(f"{swhere}.pluginRef: no plugin named {ref!r} in plugins")
        extractors = []
        for j, e in enumerate(_list(s.get("extractors"), f"{swhere}.extractors")):
            ewhere = f"{swhere}.extractors[{j}]"
            e = _mapping(e, ewhere, ("pluginRef",))
            eref = _str(e.get("pluginRef"), f"{ewhere}.pluginRef")
            if eref not in names:
                raise ConfigError(f"{ewhere}.pluginRef: no plugin named {eref!r} in plugins")
            extractors.append(eref)
        out.append(DataSourceSpec(ref, tuple(extractors)))
    return tuple(out)


def _parsers(raw: Any, source: str, names: set[str]) -> tuple[str, ...]:
    """``requestHandler.parsers``: plugin names, in order."""
    where = f"{source}: requestHandler"
    section = _mapping(raw, where, ("parsers",))
    out: list[str] = []
    for i, p in enumerate(_list(section.get("parsers"), f"{where}.parsers")):
        ref = _ref(p, f"{where}.parsers[{i}]", names)
        assert ref is not None
        out.append(ref)
    return tuple(out)


def _saturation(raw: Any, source: str,
                names: set[str]) -> tuple[str | None, Mapping[str, Any]]:
    where = f"{source}: saturationDetector"
    section = _mapping(raw, where, ("pluginRef", *sorted(_LEGACY_SATURATION)))
    legacy = {k: v for k, v in section.items() if k in _LEGACY_SATURATION}
    if "pluginRef" in section:
        if legacy:
            raise ConfigError(f"{where}: give thresholds as the detector plugin's parameters, "
                              f"not beside pluginRef")
        return _ref(section, where, names), {}
    if "metricsStalenessThreshold" in legacy:
        parse_duration(legacy["metricsStalenessThreshold"], f"{where}.metricsStalenessThreshold")
    return None, legacy


def _flow_control(raw: Any, source: str, names: set[str]) -> FlowControlConfig | None:
    if raw is None:
        return None
    try:
        flow = FlowControlConfig.from_dict(raw, f"{source}: flowControl")
    except FlowControlConfigError as e:
        raise ConfigError(str(e)) from None
    ref = flow.saturation_detector_ref
    if ref is not None and ref not in names:
        raise ConfigError(f"{source}: flowControl.saturationDetector.pluginRef: no plugin "
                          f"named {ref!r} in plugins")
    return flow


def load_config_file(path: str | Path) -> EndpointPickerConfig:
    """Parse the EndpointPickerConfig in file ``path``."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror}") from None
    if not text.strip():  # a mount gone wrong, not a wish for the default (issue 31)
        raise ConfigError(f"{p}: the file is empty (leave --config-file out for the default "
                          "config)")
    return parse_config(text, source=str(p))
