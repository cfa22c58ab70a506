"""Precise prefix-cache state from the model servers' own KV events (vLLM over ZMQ).

:class:`KVBlockIndex` knows which endpoint holds which block; :class:`KVEventSubscriptions`
keeps one :class:`KVEventSubscriber` per endpoint feeding it, or :class:`KVEventCollector`
binds one socket every server publishes into. The ``precise-prefix-cache-scorer``
plugin reads :meth:`KVBlockIndex.score`. See ``docs/precise-prefix.md``.
"""

from epp.kvcache.index import IndexConfig, KVBlockIndex, UnindexableEvent
from epp.kvcache.metrics import KVEventMetrics
from epp.kvcache.subscriber import (
    BindError,
    EndpointStream,
    KVEventCollector,
    KVEventSource,
    KVEventSubscriber,
    KVEventSubscriptions,
    SubscriberConfig,
)

__all__ = [
    "BindError",
    "EndpointStream",
    "IndexConfig",
    "KVBlockIndex",
    "KVEventCollector",
    "KVEventMetrics",
    "KVEventSource",
    "KVEventSubscriber",
    "KVEventSubscriptions",
    "SubscriberConfig",
    "UnindexableEvent",
]
