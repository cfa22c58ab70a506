"""BBR plugins, registered by upstream type name in the shared registry
(:mod:`shared.plugins`; third-party ones through the ``inference_gateway.plugins`` entry
points).

A plugin looks at the parsed request body and returns the headers to set. Adding one: a file
here with its parameters dataclass, and an entry in :data:`BUILTIN_PLUGINS`.
"""

from __future__ import annotations

from typing import Any

import orjson

from bbr.basemodels import BaseModels
from bbr.plugins.base import BbrHandle, HeaderPlugin
from bbr.plugins.base_model import BaseModelToHeader
from bbr.plugins.body_field import BodyFieldToHeader
from shared.plugins import Plugin, PluginError, PluginRegistry

BUILTIN_PLUGINS: tuple[type[Plugin], ...] = (BodyFieldToHeader, BaseModelToHeader)
DEFAULT_SPECS = ("body-field-to-header:model-to-header", "base-model-to-header:base-model")


class PluginSpecError(ValueError):
    """A ``--plugin`` value that cannot be used."""


def registry() -> PluginRegistry:
    """The BBR's built-in plugin types (plus entry points, on demand)."""
    return PluginRegistry(BUILTIN_PLUGINS)


def parse_spec(spec: str, types: PluginRegistry | None = None,
               ) -> tuple[str, str, dict[str, Any]]:
    """``type:name[:json]`` → (type, name, parameters)."""
    type_name, _, rest = spec.partition(":")
    name, _, params_text = rest.partition(":")
    if not type_name or not name:
        raise PluginSpecError(f"--plugin {spec!r}: expected type:name[:json]")
    try:
        (types or registry()).get(type_name)
    except PluginError as e:
        raise PluginSpecError(f"--plugin {spec!r}: {e}") from None
    params: Any = {}
    if params_text:
        try:
            params = orjson.loads(params_text)
        except orjson.JSONDecodeError as e:
            raise PluginSpecError(f"--plugin {spec!r}: parameters are not JSON: {e}") from None
        if not isinstance(params, dict):
            raise PluginSpecError(f"--plugin {spec!r}: parameters must be a JSON object")
    return type_name, name, params


def build(specs: list[str], base_models: BaseModels) -> list[HeaderPlugin]:
    """Plugins from ``--plugin`` values; the upstream defaults when there are none."""
    types = registry()
    handle = BbrHandle(base_models)
    plugins = []
    for spec in specs or DEFAULT_SPECS:
        type_name, name, params = parse_spec(spec, types)
        try:
            plugin = types.create(type_name, name, params, handle)
        except PluginError as e:
            raise PluginSpecError(f"--plugin {spec!r}: {e}") from None
        if not isinstance(plugin, HeaderPlugin):
            raise PluginSpecError(f"--plugin {spec!r}: {type_name} is not a BBR plugin")
        plugins.append(plugin)
    return plugins


__all__ = ["BUILTIN_PLUGINS", "BaseModelToHeader", "BbrHandle", "BodyFieldToHeader",
           "HeaderPlugin", "PluginSpecError", "build", "parse_spec", "registry"]
