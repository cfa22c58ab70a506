"""Precise prefix-cache state from the model servers' own KV events (vLLM over ZMQ).

:class:`KVBlockIndex` knows which endpoint holds which block; :class:`KVEventSubscriptions`
keeps one :class:`KVEventSubscriber` per endpoint feeding it. The ``precise-prefix-cache-scorer``
plugin reads :meth:`KVBlockIndex.score`. See ``docs/precise-prefix.md``.
"""

from epp.kvcache.index import IndexConfig, KVBlockIndex, UnindexableEvent
from epp.kvcache.metrics import KVEventMetrics
from epp.kvcache.subscriber import (
    KVEventSource,
    KVEventSubscriber,
    KVEventSubscriptions,
    SubscriberConfig,
)

__all__ = [
    "IndexConfig",
    "KVBlockIndex",
    "KVEventMetrics",
    "KVEventSource",
    "KVEventSubscriber",
    "KVEventSubscriptions",
    "SubscriberConfig",
    "UnindexableEvent",
]
