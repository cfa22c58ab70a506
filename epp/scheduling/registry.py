"""Plugin registry: ``type`` name → plugin class, and YAML ``parameters`` → typed dataclass.

Third-party plugins are found through the entry-point group ``inference_gateway.plugins``:
each entry point's name is the plugin ``type`` and its object a :class:`Plugin` subclass::

    [project.entry-points."inference_gateway.plugins"]
    my-scorer = "my_package.my_scorer:MyScorer"

They are loaded on first use of an unknown type, so a broken third-party package never
breaks configs that do not use it.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

import structlog

from epp.scheduling.plugin import Plugin

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "inference_gateway.plugins"


class PluginError(ValueError):
    """A plugin type that does not exist or parameters that do not fit it."""


def camel(name: str) -> str:
    """``max_num_of_endpoints`` → ``maxNumOfEndpoints``."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def snake(name: str) -> str:
    """``maxNumOfEndpoints`` → ``max_num_of_endpoints``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class PluginRegistry:
    """Known plugin classes by ``type_name``."""

    def __init__(self, plugins: Iterable[type[Plugin]] = ()) -> None:
        self._types: dict[str, type[Plugin]] = {}
        self._entry_points_loaded = False
        for cls in plugins:
            self.register(cls)

    def register(self, cls: type[Plugin]) -> None:
        """Make ``cls`` available under its ``type_name``."""
        if not cls.type_name:
            raise PluginError(f"{cls.__qualname__} has no type_name")
        if not dataclasses.is_dataclass(cls.parameters_type):
            raise PluginError(f"{cls.type_name}: parameters_type must be a dataclass")
        self._types[cls.type_name] = cls

    @property
    def types(self) -> list[str]:
        """Every registered type name, sorted."""
        return sorted(self._types)

    def get(self, type_name: str) -> type[Plugin]:
        """The class for ``type_name`` (entry points consulted once if it is unknown)."""
        cls = self._types.get(type_name)
        if cls is None and not self._entry_points_loaded:
            self._load_entry_points()
            cls = self._types.get(type_name)
        if cls is None:
            raise PluginError(
                f"unknown plugin type {type_name!r} (known: {', '.join(self.types)})"
            )
        return cls

    def create(self, type_name: str, name: str, parameters: Mapping[str, Any] | None) -> Plugin:
        """A configured instance of ``type_name`` named ``name``."""
        cls = self.get(type_name)
        params = parse_parameters(cls.parameters_type, parameters or {}, label=name)
        try:
            return cls(name, params)
        except (ValueError, TypeError) as e:
            raise PluginError(f"plugin {name!r} ({type_name}): {e}") from None

    def _load_entry_points(self) -> None:
        self._entry_points_loaded = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                cls = ep.load()
            except Exception as e:  # a broken third-party package must not stop startup
                log.warning("cannot load plugin entry point", entry_point=ep.name, error=str(e))
                continue
            if not (isinstance(cls, type) and issubclass(cls, Plugin)):
                log.warning("entry point is not a Plugin subclass", entry_point=ep.name)
                continue
            if not cls.type_name:
                cls.type_name = ep.name
            self.register(cls)


def parse_parameters(cls: type[Any], raw: Mapping[str, Any], *, label: str) -> Any:
    """Build dataclass ``cls`` from YAML ``raw`` (camelCase or snake_case keys).

    Unknown keys are warned about and ignored (upstream configs may carry parameters this
    implementation does not use); a wrong type is a :class:`PluginError` naming the key.
    """
    if not isinstance(raw, Mapping):
        raise PluginError(f"plugin {label!r}: parameters must be a mapping")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        fname = key if key in fields else snake(str(key))
        if fname not in fields:
            log.warning("ignoring unknown plugin parameter", plugin=label, parameter=key)
            continue
        try:
            kwargs[fname] = _coerce(value, hints[fname])
        except TypeError as e:
            raise PluginError(f"plugin {label!r}: parameter {key!r}: {e}") from None
    return cls(**kwargs)


def _coerce(value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg)
            except TypeError as e:
                errors.append(str(e))
        raise TypeError("; ".join(errors))
    if hint is Any or hint is object:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise TypeError(f"must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise TypeError(f"must be a string, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise TypeError(f"must be a list, got {value!r}")
        (item,) = typing.get_args(hint) or (Any,)
        return [_coerce(v, item) for v in value]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"must be a mapping, got {value!r}")
        k_hint, v_hint = typing.get_args(hint) or (Any, Any)
        return {_coerce(k, k_hint): _coerce(v, v_hint) for k, v in value.items()}
    return value
