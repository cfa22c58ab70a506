"""Every built-in EPP plugin type, in one registry (third-party ones join through the
``inference_gateway.plugins`` entry-point group)."""

from __future__ import annotations

from epp.datalayer import BUILTIN_PLUGINS as DATA_LAYER
from epp.flowcontrol.policies import POLICY_PLUGINS as FLOW_CONTROL
from epp.requestcontrol.plugins import BUILTIN_PLUGINS as REQUEST_CONTROL
from epp.scheduling.plugins import BUILTIN_PLUGINS as SCHEDULING
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from shared.plugins import Plugin, PluginRegistry

BUILTIN_PLUGINS: tuple[type[Plugin], ...] = (
    *SCHEDULING, ApproxPrefixCacheProducer, *REQUEST_CONTROL, *DATA_LAYER, *FLOW_CONTROL)

_FLOW = "flow control is not built yet (issue #14)"
_PRECISE = "precise prefix-cache routing and tokenization are not built yet (issue #15)"
_PD = "prefill/decode (and encode) disaggregation is not built yet (issue #16)"
_SLO = "predicted-latency / SLO scheduling is not built yet (issue #17)"
_SESSION = "session affinity is not built yet (issue #17)"
_LATER = "not built yet (issue #13)"

#: Every upstream v1.5 / llm-d plugin type this EPP does not have yet, and which issue
#: brings it: a config naming one stops with that reason instead of a bare "unknown type".
#: A type another branch registers is found before this list is consulted.
PENDING: dict[str, str] = {
    **dict.fromkeys((
        "global-strict-fairness-policy", "round-robin-fairness-policy", "fcfs-ordering-policy",
        "edf-ordering-policy", "slo-deadline-ordering-policy", "static-usage-limit-policy",
        "eviction-sheddable-filter", "eviction-priority-then-time-ordering",
        "sheddable-eviction-filter", "priority-then-time-eviction-order-policy"), _FLOW),
    **dict.fromkeys(("precise-prefix-cache-scorer", "token-producer", "tokenizer"), _PRECISE),
    **dict.fromkeys((
        "decode-filter", "prefill-filter", "encode-filter", "pd-profile-handler",
        "disagg-profile-handler", "disagg-headers-handler", "prefill-header-handler",
        "prefix-based-pd-decider", "always-disagg-pd-decider",
        "always-disagg-multimodal-decider"), _PD),
    **dict.fromkeys((
        "predicted-latency-scorer", "predicted-latency-producer", "latency-slo-admitter",
        "latency-scorer", "prefix-cache-affinity-filter", "slo-headroom-tier-filter"), _SLO),
    "session-affinity-scorer": _SESSION,
    **dict.fromkeys((
        "vllmgrpc-parser", "vertexai-parser"), _LATER),
}


def builtin_registry() -> PluginRegistry:
    """A registry of every built-in type (a fresh one: registries hold no global state)."""
    return PluginRegistry(BUILTIN_PLUGINS, pending=PENDING)
