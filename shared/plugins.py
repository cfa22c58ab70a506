"""One plugin style for both services: a registry of plugin types, a factory with a handle,
and strict parameter decoding.

A plugin is a class with a ``type_name`` (what configs call it) and a ``parameters_type``
dataclass (its ``parameters``, camelCase keys in YAML/JSON). The registry turns
``(type, name, parameters)`` into an instance through :meth:`Plugin.create`, which also gets a
:class:`Handle`: the service's view of the world (for the EPP the pool and datastore) and the
other plugins by name, so a scorer can read what a producer made without globals.

Decoding is strict, as upstream's loader is meant to be: an unknown parameter or a value of
the wrong type is a :class:`PluginError` naming it (a warning would hide a typo).

Third-party plugins arrive through the entry-point group ``inference_gateway.plugins``; each
entry point's name is the plugin ``type`` and its object a :class:`Plugin` subclass::

    [project.entry-points."inference_gateway.plugins"]
    my-scorer = "my_package.my_scorer:MyScorer"

They are loaded on first use of an unknown type, so a broken third-party package never breaks
configs that do not use it.
"""

from __future__ import annotations

import dataclasses
import difflib
import random
import re
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any, ClassVar, TypeVar

import structlog

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "inference_gateway.plugins"

P = TypeVar("P")


class Duration(float):
    """A parameter type: seconds, written in YAML as a Go duration (``200ms``, ``1m30s``) or
    a number of seconds."""


class PluginError(ValueError):
    """A plugin type that does not exist, parameters that do not fit it, or a plugin that
    cannot find another one it needs. The message names the plugin and the parameter."""


@dataclasses.dataclass(frozen=True, slots=True)
class NoParameters:
    """For plugins that take no parameters."""


class Plugin:
    """Base of every plugin of both services."""

    #: The ``type`` configs use (``queue-scorer``...).
    type_name: ClassVar[str] = ""
    #: Dataclass of the plugin's ``parameters``.
    parameters_type: ClassVar[type[Any]] = NoParameters

    def __init__(self, name: str = "", params: Any = None) -> None:
        self.name = name or self.type_name
        self.params = params if params is not None else self.parameters_type()

    @classmethod
    def create(cls: type[P], name: str, params: Any, handle: Handle) -> P:
        """The factory the registry calls. Override to reach the handle (other plugins, the
        datastore); raise ValueError/TypeError (or :class:`PluginError`) to refuse."""
        return cls(name, params)  # type: ignore[call-arg]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, params={self.params!r})"


class Handle:
    """What a plugin factory sees: the other plugins by name (services subclass this to add
    their own view, e.g. :class:`epp.handle.EppHandle` adds the pool and the datastore),
    and the service's random source: a plugin that draws takes ``rng`` from here, so one
    seed makes a whole runtime repeat itself (tests, the benchmark's twin)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._plugins: dict[str, Plugin] = {}
        self.rng = rng or random.Random()

    def add(self, plugin: Plugin) -> None:
        """Make ``plugin`` reachable by its name (names are unique)."""
        if plugin.name in self._plugins:
            raise PluginError(f"plugin name {plugin.name!r} is used twice")
        self._plugins[plugin.name] = plugin

    def plugin(self, name: str, kind: type[P]) -> P:
        """The plugin called ``name``, which must be a ``kind``; PluginError otherwise."""
        found = self._plugins.get(name)
        if found is None:
            raise PluginError(f"no plugin named {name!r}")
        if not isinstance(found, kind):
            raise PluginError(f"plugin {name!r} ({found.type_name}) is not a {kind.__name__}")
        return found

    def find(self, kind: type[P]) -> list[P]:
        """Every plugin that is a ``kind``, in the order they were added."""
        return [p for p in self._plugins.values() if isinstance(p, kind)]

    def __contains__(self, name: object) -> bool:
        return name in self._plugins

    def __iter__(self) -> Iterator[Plugin]:
        return iter(tuple(self._plugins.values()))


def camel(name: str) -> str:
    """``max_num_of_endpoints`` → ``maxNumOfEndpoints``."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def snake(name: str) -> str:
    """``maxNumOfEndpoints`` → ``max_num_of_endpoints``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class PluginRegistry:
    """Known plugin classes by ``type_name`` (plus the entry-point group's, on demand)."""

    def __init__(self, plugins: Iterable[type[Plugin]] = (), *,
                 group: str = ENTRY_POINT_GROUP, pending: Mapping[str, str] | None = None,
                 ) -> None:
        self._types: dict[str, type[Plugin]] = {}
        self._group = group
        #: Upstream type names not built yet, with why (named in the unknown-type error).
        self.pending: Mapping[str, str] = pending or {}
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
        if cls is None and type_name in self.pending:
            raise PluginError(f"unknown plugin type {type_name!r}: {self.pending[type_name]}")
        if cls is None:
            raise PluginError(f"unknown plugin type {type_name!r}{self._hint(type_name)}")
        return cls

    def _hint(self, type_name: str) -> str:
        """``; did you mean 'x'?`` for an old or misspelt name: first the types whose name
        holds every word of it (``kv-cache-scorer`` → ``kv-cache-utilization-scorer``,
        upstream's old name), shortest first; else the closest spellings; never the whole
        list of types."""
        known = sorted(self.types)
        words = set(type_name.lower().split("-"))
        close = sorted((t for t in known if words <= set(t.split("-"))), key=len)[:3]
        if not close:
            close = difflib.get_close_matches(type_name.lower(), known, n=3, cutoff=0.75)
        if not close:
            return f" ({len(known)} types are known: docs/plugins.md lists them)"
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"

    def create(self, type_name: str, name: str, parameters: Mapping[str, Any] | None,
               handle: Handle | None = None) -> Plugin:
        """A configured instance of ``type_name`` named ``name`` (added to ``handle``)."""
        cls = self.get(type_name)
        name = name or type_name
        params = parse_parameters(cls.parameters_type, parameters or {}, label=name)
        handle = handle if handle is not None else Handle()
        try:
            plugin = cls.create(name, params, handle)
        except PluginError as e:
            raise PluginError(f"plugin {name!r} ({type_name}): {e}") from None
        except (ValueError, TypeError) as e:
            raise PluginError(f"plugin {name!r} ({type_name}): {e}") from None
        if name not in handle:
            handle.add(plugin)
        return plugin

    def _load_entry_points(self) -> None:
        self._entry_points_loaded = True
        for ep in entry_points(group=self._group):
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
    """Build dataclass ``cls`` from ``raw`` (camelCase or snake_case keys).

    Strict: an unknown key or a wrong type is a :class:`PluginError` naming the key. A
    dataclass may declare ``ALIASES = {"oldName": "field_name"}`` for renamed upstream keys.
    """
    if not isinstance(raw, Mapping):
        raise PluginError(f"plugin {label!r}: parameters must be a mapping")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    aliases: Mapping[str, str] = getattr(cls, "ALIASES", {})
    kwargs: dict[str, Any] = {}
    unknown = [str(k) for k in raw
               if k not in fields and aliases.get(str(k), snake(str(k))) not in fields]
    if unknown:
        known = ", ".join(camel(f) for f in fields) or "none"
        raise PluginError(f"plugin {label!r}: unknown parameters {unknown} (known: {known})")
    for key, value in raw.items():
        fname = key if key in fields else aliases.get(str(key), snake(str(key)))
        try:
            kwargs[fname] = _coerce(value, hints[fname])
        except TypeError as e:
            raise PluginError(f"plugin {label!r}: parameter {key!r}: {e}") from None
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise PluginError(f"plugin {label!r}: {e}") from None


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
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise TypeError(f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        return value
    if hint is Any or hint is object:
        return value
    if hint is Duration:
        return _duration(value)
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
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise TypeError(f"must be a list, got {value!r}")
        args = typing.get_args(hint) or (Any,)
        items = [_coerce(v, args[0]) for v in value]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"must be a mapping, got {value!r}")
        k_hint, v_hint = typing.get_args(hint) or (Any, Any)
        return {_coerce(k, k_hint): _coerce(v, v_hint) for k, v in value.items()}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, Mapping):
            raise TypeError(f"must be a mapping, got {value!r}")
        try:
            return parse_parameters(hint, value, label=hint.__name__)
        except PluginError as e:
            raise TypeError(str(e)) from None
    return value


def _duration(value: Any) -> Duration:
    from argparse import ArgumentTypeError

    from shared.flags import duration

    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return Duration(value)
    if isinstance(value, str):
        try:
            return Duration(duration(value))
        except ArgumentTypeError:
            pass
    raise TypeError(f"must be a duration like 200ms, got {value!r}")
