"""EndpointPickerConfig: strict loading (:mod:`epp.config.loader`) and building the plugins
into a :class:`Runtime` (:mod:`epp.config.build`). Free of argparse: the command line only
passes text or a path in."""

from epp.config.build import Runtime, build, build_saturation_detector, build_scheduler
from epp.config.builtins import BUILTIN_PLUGINS, builtin_registry
from epp.config.loader import (
    API_VERSIONS,
    DEFAULT_CONFIG_YAML,
    FEATURE_GATES,
    KIND,
    ConfigError,
    DataSourceSpec,
    EndpointPickerConfig,
    PluginRef,
    PluginSpec,
    ProfileSpec,
    load_config_file,
    parse_config,
    parse_duration,
)

__all__ = [
    "API_VERSIONS",
    "BUILTIN_PLUGINS",
    "DEFAULT_CONFIG_YAML",
    "FEATURE_GATES",
    "KIND",
    "ConfigError",
    "DataSourceSpec",
    "EndpointPickerConfig",
    "PluginRef",
    "PluginSpec",
    "ProfileSpec",
    "Runtime",
    "build",
    "build_saturation_detector",
    "build_scheduler",
    "builtin_registry",
    "load_config_file",
    "parse_config",
    "parse_duration",
]
