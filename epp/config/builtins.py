"""Every built-in EPP plugin type, in one registry (third-party ones join through the
``inference_gateway.plugins`` entry-point group)."""

from __future__ import annotations

from epp.datalayer import BUILTIN_PLUGINS as DATA_LAYER
from epp.flowcontrol.policies import POLICY_PLUGINS as FLOW_CONTROL
from epp.requestcontrol.plugins import BUILTIN_PLUGINS as REQUEST_CONTROL
from epp.requestcontrol.plugins.token_producer import TokenProducer
from epp.scheduling.plugins import BUILTIN_PLUGINS as SCHEDULING
from epp.scheduling.plugins.prefix.precise_prefix_cache_producer import (
    PrecisePrefixCacheProducer,
)
from epp.scheduling.plugins.prefix.precise_prefix_cache_scorer import PrecisePrefixCacheScorer
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from epp.sources.file_discovery import FileDiscovery
from shared.plugins import Plugin, PluginRegistry

BUILTIN_PLUGINS: tuple[type[Plugin], ...] = (
    *SCHEDULING, ApproxPrefixCacheProducer, PrecisePrefixCacheScorer, *REQUEST_CONTROL,
    PrecisePrefixCacheProducer, FileDiscovery,
    TokenProducer, *DATA_LAYER, *FLOW_CONTROL)

_FLOW = ("GIE v1.5's name for an eviction policy, which did nothing there; issue #27 built "
         "eviction under llm-d-router v0.10's names: use sheddable-eviction-filter / "
         "priority-then-time-eviction-order-policy with flowControl.enableEviction: true")
_PRECISE = "a local tokenizer plugin is not built yet (issue #15; token-producer asks the server)"
_PD = ("deprecated in llm-d, not built by issue #29: disagg-profile-handler sets the same "
       "x-prefiller-host-port and x-encoder-hosts-ports headers")
_SLO = ("the all-in-one predicted-latency-scorer is not built yet (issue #17; use "
        "predicted-latency-producer + latency-scorer)")

#: Every upstream v1.5 / llm-d plugin type this EPP does not have yet, and which issue
#: brings it: a config naming one stops with that reason instead of a bare "unknown type".
#: A type another branch registers is found before this list is consulted.
PENDING: dict[str, str] = {
    **dict.fromkeys((
        "eviction-sheddable-filter", "eviction-priority-then-time-ordering"), _FLOW),
    "tokenizer": _PRECISE,
    "disagg-headers-handler": _PD,
    "predicted-latency-scorer": _SLO,
}


def builtin_registry() -> PluginRegistry:
    """A registry of every built-in type (a fresh one: registries hold no global state)."""
    return PluginRegistry(BUILTIN_PLUGINS, pending=PENDING)
