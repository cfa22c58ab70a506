"""Every built-in EPP plugin type, in one registry (third-party ones join through the
``inference_gateway.plugins`` entry-point group)."""

from __future__ import annotations

from epp.datalayer import BUILTIN_PLUGINS as DATA_LAYER
from epp.requestcontrol.plugins import BUILTIN_PLUGINS as REQUEST_CONTROL
from epp.requestcontrol.plugins.token_producer import TokenProducer
from epp.scheduling.plugins import BUILTIN_PLUGINS as SCHEDULING
from epp.scheduling.plugins.prefix.precise_prefix_cache_scorer import PrecisePrefixCacheScorer
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from shared.plugins import Plugin, PluginRegistry

BUILTIN_PLUGINS: tuple[type[Plugin], ...] = (
    *SCHEDULING, ApproxPrefixCacheProducer, PrecisePrefixCacheScorer, *REQUEST_CONTROL,
    TokenProducer, *DATA_LAYER)


def builtin_registry() -> PluginRegistry:
    """A registry of every built-in type (a fresh one: registries hold no global state)."""
    return PluginRegistry(BUILTIN_PLUGINS)
