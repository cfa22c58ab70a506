"""Prometheus series of the KV-event subscribers and the block index.

Counters are bumped per batch or per event (never per request); index sizes are read by a
collector when Prometheus scrapes.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.kvcache.index import KVBlockIndex

_LAG = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class KVEventMetrics:
    """The counters one EPP keeps for all its KV-event subscribers."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        p = "inference_extension_kv_events_"
        self.batches = Counter(p + "batches_total", "KV-event batches applied.", ["endpoint"],
                               registry=registry)
        self.events = Counter(p + "events_total", "KV events applied, by type.", ["type"],
                              registry=registry)
        self.blocks = Counter(p + "blocks_total", "Block hashes applied, by event type.",
                              ["type"], registry=registry)
        self.malformed = Counter(p + "malformed_total",
                                 "Messages or events dropped as malformed, by reason.",
                                 ["reason"], registry=registry)
        self.skipped = Counter(p + "skipped_events_total",
                               "Well-formed events the index could not apply, by reason "
                               "(unknown_parent, block_size, bad_token_ids).", ["reason"],
                               registry=registry)
        self.unmatched = Counter(p + "unmatched_batches_total",
                                 "Batches on the bound (zmqEndpoint) socket whose topic names "
                                 "no single pool endpoint, by reason (no_endpoint, "
                                 "ambiguous_endpoint).", ["reason"], registry=registry)
        self.gaps = Counter(p + "sequence_gaps_total",
                            "Missed sequence ranges, by outcome (replayed | resynced).",
                            ["outcome"], registry=registry)
        self.restarts = Counter(p + "publisher_restarts_total",
                                "Sequence went backwards: the server restarted, its blocks "
                                "were forgotten.", ["endpoint"], registry=registry)
        self.disconnects = Counter(p + "disconnects_total",
                                   "Connections to a publisher lost (its blocks forgotten).",
                                   ["endpoint"], registry=registry)
        self.reconnects = Counter(p + "reconnects_total",
                                  "Subscriber sockets re-created after an error or a stall.",
                                  ["endpoint"], registry=registry)
        self.lag = Histogram(p + "lag_seconds", "Publish (batch ts) to indexed.",
                             buckets=_LAG, registry=registry)
        # llm-d-router v0.10's subscriber health series (its embedded llm-d-kv-cache names);
        # `pod_identifier` is our endpoint name. Active subscribers: see SubscriberCollector.
        q = "llm_d_router_epp_kv_cache_events_"
        self.reconnections = Counter(q + "subscriber_reconnections_total",
                                     "Subscriber reconnection attempts.", ["pod_identifier"],
                                     registry=registry)
        self.messages = Counter(q + "messages_received_total",
                                "Messages received from a subscriber's socket.",
                                ["pod_identifier"], registry=registry)
        self.zmq_errors = Counter(q + "zmq_errors_total",
                                  "Subscriber socket errors, by operation (connect, recv).",
                                  ["pod_identifier", "operation"], registry=registry)

    def forget_subscriber(self, endpoint: str) -> None:
        """Drop the per-subscriber series of a subscriber that is gone (as upstream)."""
        for counter in (self.reconnections, self.messages):
            with contextlib.suppress(KeyError):
                counter.remove(endpoint)
        for operation in ZMQ_OPERATIONS:
            with contextlib.suppress(KeyError):
                self.zmq_errors.remove(endpoint, operation)


ZMQ_OPERATIONS = ("connect", "recv")

_SUBSCRIPTIONS: weakref.WeakSet[Any] = weakref.WeakSet()


def track_subscriptions(subscriptions: Any) -> None:
    """Count ``subscriptions``' subscribers (anything with a sized ``subscribers``) in
    ``llm_d_router_epp_kv_cache_events_active_subscribers`` while it lives."""
    _SUBSCRIPTIONS.add(subscriptions)


class _SubscriberCollector(Collector):
    """Subscribers currently managed, connected or retrying (read at scrape time)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("llm_d_router_epp_kv_cache_events_active_subscribers",
                              "KV-event subscribers currently managed, including those "
                              "retrying a failed connection.")
        g.add_metric([], sum(len(s.subscribers) for s in list(_SUBSCRIPTIONS)))
        yield g


_LIVE: weakref.WeakSet[KVBlockIndex] = weakref.WeakSet()


def track(index: KVBlockIndex) -> None:
    """Count ``index`` in the size gauges and :func:`cached_blocks` while it lives."""
    _LIVE.add(index)


def cached_blocks() -> dict[str, int] | None:
    """Blocks the live indexes (normally one per precise scorer) know each endpoint holds,
    summed; None when no index lives (no precise scorer configured)."""
    indexes = list(_LIVE)
    if not indexes:
        return None
    total: dict[str, int] = {}
    for index in indexes:
        for ep, blocks in index.endpoint_blocks().items():
            total[ep] = total.get(ep, 0) + blocks
    return total


class _IndexCollector(Collector):
    """The live indexes' sizes, read at scrape time."""

    #: Labels of the per-endpoint family (read by tools when it has no sample yet).
    _labelnames = ("endpoint",)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        keys = GaugeMetricFamily("inference_extension_kv_index_keys",
                                 "Request keys (distinct blocks) held by the index.")
        size = GaugeMetricFamily("inference_extension_kv_index_estimated_bytes",
                                 "Memory of the KV-event index, estimated from its entry "
                                 "counts.")
        indexes = list(_LIVE)
        keys.add_metric([], sum(len(index) for index in indexes))
        size.add_metric([], sum(index.estimated_bytes() for index in indexes))
        yield keys
        yield size
        per = GaugeMetricFamily("inference_extension_kv_index_endpoint_blocks",
                                "Blocks the index knows each endpoint holds.",
                                labels=["endpoint"])
        for ep, blocks in sorted((cached_blocks() or {}).items()):
            per.add_metric([ep], blocks)
        yield per


REGISTRY.register(_IndexCollector())
REGISTRY.register(_SubscriberCollector())
