"""Building blocks of the v0.3 decision tree, shared by the legacy filter plugins.

Each function takes candidates and returns the kept subset (possibly empty); the tree in
:mod:`legacy_decision_tree_filter` decides what an empty subset means.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView


def least_queue(endpoints: Sequence[EndpointView]) -> list[EndpointView]:
    """Keep queue in [min, min + (max - min) // n] (integer step, as v0.3 did)."""
    if not endpoints:
        return []
    qs = [v.queue for v in endpoints]
    lo, hi = min(qs), max(qs)
    top = lo + (hi - lo) // len(endpoints)
    return [v for v, q in zip(endpoints, qs, strict=True) if q <= top]


def least_kv_cache(endpoints: Sequence[EndpointView]) -> list[EndpointView]:
    """Keep KV usage in [min, min + (max - min) / n]."""
    if not endpoints:
        return []
    kvs = [v.metrics.kv_usage for v in endpoints]
    lo, hi = min(kvs), max(kvs)
    top = lo + (hi - lo) / len(endpoints)
    return [v for v, kv in zip(endpoints, kvs, strict=True) if kv <= top]


def low_queue(endpoints: Sequence[EndpointView], threshold: int) -> list[EndpointView]:
    """Keep queue < threshold."""
    return [v for v in endpoints if v.queue < threshold]


def lora_active(endpoints: Sequence[EndpointView], adapter: str | None) -> list[EndpointView]:
    """Keep endpoints where ``adapter`` is already running (none when no adapter)."""
    if adapter is None:
        return []
    out = []
    for v in endpoints:
        lora = v.metrics.lora
        if lora is not None and adapter in lora.running:
            out.append(v)
    return out


def lora_can_accept(endpoints: Sequence[EndpointView], adapter: str | None) -> list[EndpointView]:
    """Keep endpoints running ``adapter`` or with room for one more adapter."""
    out = []
    for v in endpoints:
        lora = v.metrics.lora
        if lora is None:
            continue
        if (adapter is not None and adapter in lora.running) or len(lora.running) < lora.max_lora:
            out.append(v)
    return out


def has_capacity(
    endpoints: Sequence[EndpointView], queue_threshold: int, kv_threshold: float
) -> list[EndpointView]:
    """Keep queue <= queue_threshold and KV usage <= kv_threshold."""
    return [
        v for v in endpoints if v.queue <= queue_threshold and v.metrics.kv_usage <= kv_threshold
    ]
