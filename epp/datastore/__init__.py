"""Typed models of the pool and its endpoints, and the live store the EPP serves from.

This package imports nothing else from ``epp``: sources and the scraper write into it, the
scheduler and the request path read from it.
"""

from epp.datastore.endpoint_state import NO_METRICS, EndpointMetrics, EndpointView, LoraInfo
from epp.datastore.models import (
    ACTIVE_PORTS_ANNOTATION,
    ENGINE_TYPE_LABEL,
    Criticality,
    Endpoint,
    EngineType,
    FailureMode,
    LegacyModel,
    ModelRewrite,
    Objective,
    ObjectRef,
    Pod,
    PodCondition,
    Pool,
    PoolObject,
    RewriteRule,
    WeightedModel,
)
from epp.datastore.objects import ObjectError, parse_object
from epp.datastore.snapshot import (
    ModelResolution,
    PrioritySource,
    Snapshot,
    SnapshotError,
    build_snapshot,
    endpoints_for,
    weighted_choice,
)
from epp.datastore.store import Datastore

__all__ = [
    "ACTIVE_PORTS_ANNOTATION",
    "ENGINE_TYPE_LABEL",
    "NO_METRICS",
    "Criticality",
    "Datastore",
    "Endpoint",
    "EndpointMetrics",
    "EndpointView",
    "EngineType",
    "FailureMode",
    "LegacyModel",
    "LoraInfo",
    "ModelResolution",
    "ModelRewrite",
    "ObjectError",
    "ObjectRef",
    "Objective",
    "Pod",
    "PodCondition",
    "Pool",
    "PoolObject",
    "PrioritySource",
    "RewriteRule",
    "Snapshot",
    "SnapshotError",
    "WeightedModel",
    "build_snapshot",
    "endpoints_for",
    "parse_object",
    "weighted_choice",
]
