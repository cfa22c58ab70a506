"""BBR plugins, registered by upstream type name.

A plugin looks at the parsed request body and returns the headers to set. Adding one: a file
here with its parameters dataclass, and an entry in :data:`REGISTRY`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from bbr.basemodels import BaseModels
from bbr.plugins.base_model import BaseModelToHeader
from bbr.plugins.body_field import BodyFieldToHeader


class Plugin(Protocol):
    """What the router calls for each request with a JSON body."""

    @property
    def type_name(self) -> str:
        """The registered type, e.g. ``body-field-to-header``."""

    @property
    def name(self) -> str:
        """The instance name given with ``--plugin``."""

    @property
    def owned_headers(self) -> tuple[str, ...]:
        """Headers this plugin sets; a client's own copies are removed."""

    def headers(self, body: dict[str, Any]) -> dict[str, str]:
        """Headers to set for this body (empty: none)."""


Factory = Callable[[str, dict[str, Any], BaseModels], Plugin]

REGISTRY: dict[str, Factory] = {
    BodyFieldToHeader.type_name: lambda name, params, _: BodyFieldToHeader.create(name, params),
    BaseModelToHeader.type_name: lambda name, params, bm: BaseModelToHeader.create(
        name, params, bm),
}


class PluginSpecError(ValueError):
    """A ``--plugin`` value that cannot be used."""


def parse_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """``type:name[:json]`` → (type, name, parameters)."""
    import orjson

    type_name, _, rest = spec.partition(":")
    name, _, params_text = rest.partition(":")
    if not type_name or not name:
        raise PluginSpecError(f"--plugin {spec!r}: expected type:name[:json]")
    if type_name not in REGISTRY:
        known = ", ".join(sorted(REGISTRY))
        raise PluginSpecError(f"--plugin {spec!r}: unknown plugin type {type_name!r} ({known})")
    params: Any = {}
    if params_text:
        try:
            params = orjson.loads(params_text)
        except orjson.JSONDecodeError as e:
            raise PluginSpecError(f"--plugin {spec!r}: parameters are not JSON: {e}") from None
        if not isinstance(params, dict):
            raise PluginSpecError(f"--plugin {spec!r}: parameters must be a JSON object")
    return type_name, name, params


def build(specs: list[str], base_models: BaseModels) -> list[Plugin]:
    """Plugins from ``--plugin`` values; the upstream defaults when there are none."""
    if not specs:
        specs = ["body-field-to-header:model-to-header", "base-model-to-header:base-model"]
    plugins = []
    for spec in specs:
        type_name, name, params = parse_spec(spec)
        try:
            plugins.append(REGISTRY[type_name](name, params, base_models))
        except (TypeError, ValueError) as e:
            raise PluginSpecError(f"--plugin {spec!r}: {e}") from None
    return plugins
