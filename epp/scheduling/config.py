"""``EndpointPickerConfig`` YAML → a ready :class:`Scheduler` (and saturation detector).

Upstream files load unchanged::

    apiVersion: inference.networking.x-k8s.io/v1alpha1   # or llm-d.ai/v1alpha1
    kind: EndpointPickerConfig
    plugins:
    - type: queue-scorer                    # name defaults to the type
    - name: picker
      type: max-score-picker
      parameters: {maxNumOfEndpoints: 2}
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: queue-scorer
        weight: 2
      - pluginRef: picker
    featureGates: [...]
    saturationDetector: {queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8,
                         metricsStalenessThreshold: 200ms}

Defaults when silent: ``single-profile-handler``; ``max-score-picker`` in a profile without
a picker; with no plugins at all, the default profile queue-scorer x2,
kv-cache-utilization-scorer x2, prefix-cache-scorer x3. With plugins but no profiles, one
profile ``default`` uses every plugin (weight 1 for scorers).
"""

from __future__ import annotations

import random
from argparse import ArgumentTypeError
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog
import yaml

from epp.scheduling.plugin import Filter, Picker, Plugin, ProfileHandler, SchedulerHooks, Scorer
from epp.scheduling.plugins import BUILTIN_PLUGINS
from epp.scheduling.profile import SchedulingProfile, WeightedScorer
from epp.scheduling.registry import PluginError, PluginRegistry
from epp.scheduling.saturation import SaturationDetectorConfig, UtilizationDetector
from epp.scheduling.scheduler import Scheduler
from shared.flags import duration

log = structlog.get_logger(__name__)

API_VERSIONS: Final = ("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1")
KIND: Final = "EndpointPickerConfig"
_KNOWN_KEYS: Final = frozenset(
    {"apiVersion", "kind", "plugins", "schedulingProfiles", "featureGates", "saturationDetector"}
)
DEFAULT_PROFILE: Final = "default"
DEFAULT_CONFIG_YAML: Final = f"""\
apiVersion: {API_VERSIONS[0]}
kind: {KIND}
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: {DEFAULT_PROFILE}
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""


class ConfigError(ValueError):
    """The EndpointPickerConfig cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """One entry of ``plugins``."""

    name: str
    type: str
    parameters: Mapping[str, Any] = field(default_factory=dict)


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
class EndpointPickerConfig:
    """A parsed, validated EndpointPickerConfig (plugins not yet instantiated)."""

    plugins: tuple[PluginSpec, ...]
    profiles: tuple[ProfileSpec, ...]
    feature_gates: tuple[str, ...] = ()
    saturation: SaturationDetectorConfig = field(default_factory=SaturationDetectorConfig)


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


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: must be a mapping, got {type(value).__name__}")
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


def parse_config(text: str | None, *, source: str = "config") -> EndpointPickerConfig:
    """Parse EndpointPickerConfig YAML (None or blank = the default config)."""
    if text is None or not text.strip():
        text = DEFAULT_CONFIG_YAML
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from None
    top = _mapping(doc, source)
    for key in top:
        if key not in _KNOWN_KEYS:
            log.warning("ignoring unknown EndpointPickerConfig key", source=source, key=key)
    api = top.get("apiVersion")
    if api is not None and api not in API_VERSIONS:
        raise ConfigError(
            f"{source}: apiVersion: must be one of {', '.join(API_VERSIONS)}, got {api!r}"
        )
    kind = top.get("kind")
    if kind is not None and kind != KIND:
        raise ConfigError(f"{source}: kind: must be {KIND}, got {kind!r}")

    plugins: list[PluginSpec] = []
    names: set[str] = set()
    for i, p in enumerate(_list(top.get("plugins"), f"{source}: plugins")):
        where = f"{source}: plugins[{i}]"
        p = _mapping(p, where)
        ptype = _str(p.get("type"), f"{where}.type")
        name = _str(p.get("name", ptype), f"{where}.name")
        if name in names:
            raise ConfigError(f"{where}.name: plugin name {name!r} is used twice")
        names.add(name)
        params = _mapping(p.get("parameters"), f"{where}.parameters")
        plugins.append(PluginSpec(name=name, type=ptype, parameters=params))

    profiles: list[ProfileSpec] = []
    for i, prof in enumerate(_list(top.get("schedulingProfiles"), f"{source}: schedulingProfiles")):
        where = f"{source}: schedulingProfiles[{i}]"
        prof = _mapping(prof, where)
        pname = _str(prof.get("name"), f"{where}.name")
        if any(p.name == pname for p in profiles):
            raise ConfigError(f"{where}.name: profile name {pname!r} is used twice")
        refs: list[PluginRef] = []
        for j, ref in enumerate(_list(prof.get("plugins"), f"{where}.plugins")):
            rwhere = f"{where}.plugins[{j}]"
            ref = _mapping(ref, rwhere)
            target = _str(ref.get("pluginRef"), f"{rwhere}.pluginRef")
            if target not in names:
                raise ConfigError(f"{rwhere}.pluginRef: no plugin named {target!r} in plugins")
            w = ref.get("weight")
            if w is not None and (
                isinstance(w, bool) or not isinstance(w, int | float) or not w >= 0
            ):
                raise ConfigError(f"{rwhere}.weight: must be a number >= 0, got {w!r}")
            refs.append(PluginRef(target, None if w is None else float(w)))
        profiles.append(ProfileSpec(pname, tuple(refs)))

    gates = tuple(str(g) for g in _list(top.get("featureGates"), f"{source}: featureGates"))
    return EndpointPickerConfig(
        plugins=tuple(plugins),
        profiles=tuple(profiles),
        feature_gates=gates,
        saturation=_saturation(_mapping(top.get("saturationDetector"),
                                        f"{source}: saturationDetector"), source),
    )


def _saturation(raw: Mapping[str, Any], source: str) -> SaturationDetectorConfig:
    where = f"{source}: saturationDetector"
    d = SaturationDetectorConfig()
    q = raw.get("queueDepthThreshold", d.queue_depth_threshold)
    if isinstance(q, bool) or not isinstance(q, int) or q <= 0:
        raise ConfigError(f"{where}.queueDepthThreshold: must be an integer > 0, got {q!r}")
    kv = raw.get("kvCacheUtilThreshold", d.kv_cache_util_threshold)
    if isinstance(kv, bool) or not isinstance(kv, int | float) or not 0 < kv <= 1:
        raise ConfigError(f"{where}.kvCacheUtilThreshold: must be in (0, 1], got {kv!r}")
    stale = parse_duration(
        raw.get("metricsStalenessThreshold", d.metrics_staleness_threshold),
        f"{where}.metricsStalenessThreshold",
    )
    return SaturationDetectorConfig(q, float(kv), stale)


def load_config_file(path: str | Path) -> EndpointPickerConfig:
    """Parse the EndpointPickerConfig in file ``path``."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror}") from None
    return parse_config(text, source=str(p))


def build_scheduler(
    config: EndpointPickerConfig | None = None,
    *,
    registry: PluginRegistry | None = None,
    rng: random.Random | None = None,
    hooks: SchedulerHooks | None = None,
) -> Scheduler:
    """Instantiate the plugins of ``config`` (default config when None) into a scheduler."""
    config = config or parse_config(None)
    registry = registry or PluginRegistry(BUILTIN_PLUGINS)
    instances: dict[str, Plugin] = {}
    for spec in config.plugins:
        try:
            instances[spec.name] = registry.create(spec.type, spec.name, spec.parameters)
        except PluginError as e:
            raise ConfigError(f"plugins: {spec.name}: {e}") from None
    handlers = [p for p in instances.values() if isinstance(p, ProfileHandler)]
    if len(handlers) > 1:
        raise ConfigError(
            "plugins: more than one profile handler: " + ", ".join(h.name for h in handlers)
        )
    handler = handlers[0] if handlers else registry.create("single-profile-handler", "", None)
    assert isinstance(handler, ProfileHandler)

    specs = config.profiles or (
        ProfileSpec(
            DEFAULT_PROFILE,
            tuple(PluginRef(s.name) for s in config.plugins if instances[s.name] is not handler),
        ),
    )
    default_picker: Picker | None = None
    profiles: list[SchedulingProfile] = []
    for pspec in specs:
        where = f"schedulingProfiles: {pspec.name}"
        filters: list[Filter] = []
        scorers: list[WeightedScorer] = []
        picker: Picker | None = None
        for ref in pspec.plugins:
            plugin = instances[ref.plugin_ref]
            used = False
            if isinstance(plugin, Filter):
                filters.append(plugin)
                used = True
            if isinstance(plugin, Scorer):
                scorers.append(WeightedScorer(plugin, 1.0 if ref.weight is None else ref.weight))
                used = True
            if isinstance(plugin, Picker):
                if picker is not None:
                    raise ConfigError(
                        f"{where}: two pickers ({picker.name}, {plugin.name}); use one"
                    )
                picker = plugin
                used = True
            if not used:
                raise ConfigError(
                    f"{where}: plugin {plugin.name!r} ({plugin.type_name}) is not a filter, "
                    f"scorer or picker"
                )
        if picker is None:
            if default_picker is None:
                created = registry.create("max-score-picker", "", None)
                assert isinstance(created, Picker)
                default_picker = created
            picker = default_picker
        profiles.append(SchedulingProfile(pspec.name, picker, filters, scorers))
    try:
        return Scheduler(
            profiles, handler, plugins=list(instances.values()), rng=rng, hooks=hooks
        )
    except ValueError as e:
        raise ConfigError(f"schedulingProfiles: {e}") from None


def build_saturation_detector(config: EndpointPickerConfig | None = None) -> UtilizationDetector:
    """The ``utilization`` detector configured by ``saturationDetector``."""
    return UtilizationDetector(config.saturation if config else None)
