"""Plugin stability levels and deprecations, as llm-d-router v0.10 registers them
(``cmd/epp/runner/runner.go``: ``Register(type, Stability*, ...)`` and
``RegisterDeprecated(type, ..., deprecatedIn, scheduledRemovalIn, replacement)``).

- **Alpha** types are experimental upstream: the EPP refuses to start with one unless
  ``--allow-experimental-plugins`` is given (``epp --check-config`` too).
- **Deprecated** types still load, with one warning naming the replacement and the release
  that removes them, for exactly as long as upstream v0.10 still registers them.

Types upstream does not register (ours, third-party) are not Alpha: upstream treats an
unregistered type as Stable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import structlog

log = structlog.get_logger(__name__)

ALPHA: Final = "Alpha"
BETA: Final = "Beta"
STABLE: Final = "Stable"

#: Every plugin type llm-d-router v0.10.0 registers (``registerInTreePlugins``).
V010_TYPES: Final = frozenset({
    "active-request-scorer", "agent-identity", "anthropic-parser", "dcgm-extractor",
    "models-data-extractor", "topology-extractor", "burst-prefix-cache-producer",
    "by-label-selector", "by-label", "decode-filter", "encode-filter", "label-selector-filter",
    "prefill-filter", "concurrency-detector", "context-length-aware",
    "data-parallel-profile-handler", "always-disagg-multimodal-decider",
    "always-disagg-pd-decider", "disagg-headers-handler", "disagg-profile-handler",
    "pd-profile-handler", "prefill-header-handler", "prefix-based-pd-decider",
    "disaggregatedset-rollout-screener", "multicluster-file-discovery", "file-discovery",
    "edf-ordering-policy", "endpoint-attribute-scorer", "endpoint-attribute-filter",
    "sheddable-eviction-filter", "priority-then-time-eviction-order-policy",
    "core-metrics-extractor", "multicluster-metrics-extractor", "fcfs-ordering-policy",
    "global-strict-fairness-policy", "header-label-affinity-scorer", "header-profile-handler",
    "inflight-load-producer", "kv-cache-utilization-scorer",
    "multicluster-kv-cache-utilization-scorer", "predicted-latency-producer",
    "latency-scorer", "latency-slo-admitter", "load-aware-scorer", "lora-affinity-scorer",
    "max-score-picker", "mm-embeddings-cache-scorer", "mm-embeddings-cache-producer",
    "no-hit-lru-scorer", "openai-parser", "p2p-source-producer", "passthrough-parser",
    "precise-prefix-cache-scorer", "precise-prefix-cache-producer",
    "multicluster-prefix-cache-scorer", "prefix-cache-scorer", "prefix-cache-affinity-filter",
    "priority-holdback-policy", "probabilistic-admitter", "program-aware-fairness",
    "multicluster-queue-scorer", "queue-scorer", "random-picker",
    "approx-prefix-cache-producer", "multicluster-approx-prefix-cache-producer",
    "request-attribute-reporter", "round-robin-fairness-policy",
    "running-requests-size-scorer", "session-affinity-scorer",
    "multicluster-session-affinity-filter", "session-affinity-filter", "session-id-producer",
    "single-profile-handler", "slo-deadline-ordering-policy", "slo-headroom-tier-filter",
    "soft-reflective-ceiling-policy", "metrics-data-source",
    "multicluster-metrics-data-source", "endpoint-notification-source",
    "k8s-notification-source", "dcgm-data-source", "models-data-source",
    "header-based-testing-filter", "destination-endpoint-served-verifier", "tokenizer",
    "token-producer", "token-load-scorer", "topology-affinity-filter",
    "topology-affinity-scorer", "static-usage-limit-policy", "utilization-detector",
    "utilization-filter", "vertexai-parser", "vllmgrpc-parser", "vllmhttp-parser",
    "weighted-random-picker",
})

#: Every type llm-d-router v0.10.0 registers as Alpha (the rest it registers are Beta).
ALPHA_TYPES: Final = frozenset({
    "disaggregatedset-rollout-screener", "session-affinity-filter",
    "endpoint-attribute-filter", "topology-affinity-filter", "utilization-filter",
    "session-affinity-scorer", "header-label-affinity-scorer", "topology-extractor",
    "dcgm-data-source", "dcgm-extractor", "header-profile-handler",
    "endpoint-attribute-scorer", "topology-affinity-scorer", "burst-prefix-cache-producer",
    "p2p-source-producer", "multicluster-session-affinity-filter", "multicluster-queue-scorer",
    "multicluster-kv-cache-utilization-scorer", "multicluster-prefix-cache-scorer",
    "multicluster-approx-prefix-cache-producer", "sheddable-eviction-filter",
    "priority-then-time-eviction-order-policy", "priority-holdback-policy",
    "soft-reflective-ceiling-policy", "multicluster-metrics-data-source",
    "multicluster-metrics-extractor", "multicluster-file-discovery", "agent-identity",
})


@dataclass(frozen=True, slots=True)
class Deprecation:
    """``RegisterDeprecated``'s metadata for one type."""

    since: str
    removal: str
    replacement: str


#: Deprecated types upstream v0.10.0 still registers (its ``RegisterDeprecated`` calls), plus
#: ``precise-prefix-cache-scorer``, which its README marks deprecated in favour of the
#: producer + generic scorer split (registered there without the metadata: no removal set).
DEPRECATED: Final[dict[str, Deprecation]] = {
    "by-label-selector": Deprecation("v0.9.0", "v0.11.0", "label-selector-filter"),
    "by-label": Deprecation("v0.9.0", "v0.11.0", "label-selector-filter"),
    "disagg-headers-handler": Deprecation("v0.9.0", "v0.11.0", "disagg-profile-handler"),
    "prefill-header-handler": Deprecation("v0.9.0", "v0.11.0", "disagg-profile-handler"),
    "pd-profile-handler": Deprecation("v0.7.0", "v0.9.0", "disagg-profile-handler"),
    "tokenizer": Deprecation("v0.9.0", "v0.11.0", "token-producer"),
    "precise-prefix-cache-scorer": Deprecation(
        "v0.10.0", "", "precise-prefix-cache-producer + prefix-cache-scorer"),
}


def stability(type_name: str) -> str | None:
    """Upstream v0.10's stability level of ``type_name`` (Alpha or Beta), None when v0.10
    does not register it (ours, or dropped upstream)."""
    if type_name not in V010_TYPES:
        return None
    return ALPHA if type_name in ALPHA_TYPES else BETA


def v010_status(type_name: str) -> str:
    """What docs/compatibility.md's ``v0.10`` column says for ``type_name``."""
    level = stability(type_name)
    if level is None:
        return "-"
    dep = DEPRECATED.get(type_name)
    if dep is None:
        return level
    return f"{level}, deprecated" + (f" (removal {dep.removal})" if dep.removal else "")


class ExperimentalPluginError(ValueError):
    """An Alpha plugin in the config without ``--allow-experimental-plugins``."""


def check_stability(plugins: Iterable[tuple[str, str]], *, allow_experimental: bool) -> None:
    """Refuse the first Alpha ``(name, type)`` (by name, as upstream) unless allowed."""
    if allow_experimental:
        return
    for name, type_name in sorted(plugins):
        if type_name in ALPHA_TYPES:
            raise ExperimentalPluginError(
                f"plugin {name!r} (type {type_name!r}) is Alpha (experimental) upstream; "
                f"start with --allow-experimental-plugins to use it")


def warn_deprecated(type_name: str, name: str, where: str) -> bool:
    """Log the deprecation of ``type_name`` (True when it is deprecated)."""
    dep = DEPRECATED.get(type_name)
    if dep is None:
        return False
    log.warning("plugin type is deprecated", type=type_name, plugin=name, where=where,
                deprecated_in=dep.since, removal_in=dep.removal or "not scheduled",
                use=dep.replacement)
    return True
