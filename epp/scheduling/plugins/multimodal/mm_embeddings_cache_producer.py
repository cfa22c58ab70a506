"""``mm-embeddings-cache-producer`` (llm-d-router v0.10): which endpoints probably hold a
request's multimodal items in their encoder cache, learnt from past picks."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import structlog

from epp import telemetry as m
from epp.datalayer.endpoint_events import EndpointEvent, EndpointExtractor, EventKind
from epp.datastore import EndpointView
from epp.requestcontrol.plugin import DataProducer, PreRequest
from epp.scheduling.plugin import EndpointsRemoved, Plugin
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from modelserver.multimodal import MMItem, unique_items
from shared.plugins import Handle

log = structlog.get_logger(__name__)

#: llm-d's defaults: a 4 GiB encoder cache per server, 2 MiB assumed per item.
DEFAULT_CACHE_MB = 4096
MB_PER_ITEM = 2


@dataclass(frozen=True, slots=True)
class MMEmbeddingsCacheProducerParameters:
    """``cacheSizeInMBPerServer``: the model servers' encoder-cache size in MiB (default
    4096; <= 0 means the default); the producer remembers ``size / 2`` items per endpoint.
    ``cacheSizeInMB``: the spelling llm-d-router v0.10's own sample config uses (llm-d reads
    only ``cacheSizeInMBPerServer`` and ignores it); honoured here as the same value, with a
    warning."""

    ALIASES: ClassVar[dict[str, str]] = {
        "cacheSizeInMBPerServer": "cache_size_in_mb_per_server",
        "cacheSizeInMB": "cache_size_in_mb"}

    cache_size_in_mb_per_server: int = 0
    cache_size_in_mb: int = 0

    @property
    def capacity(self) -> int:
        """Items remembered per endpoint."""
        mb = self.cache_size_in_mb_per_server or self.cache_size_in_mb
        if mb <= 0:
            mb = DEFAULT_CACHE_MB
        return max(1, mb // MB_PER_ITEM)


@dataclass(frozen=True, slots=True)
class EncoderCacheMatch:
    """One request's match: its unique items and, per endpoint key, how many it holds."""

    items: tuple[MMItem, ...]
    matched: dict[str, int]


_NO_MATCH = EncoderCacheMatch((), {})


class MMEmbeddingsCacheProducer(Plugin, DataProducer, PreRequest, EndpointsRemoved,
                                EndpointExtractor):
    """Per endpoint an LRU of item hashes (``capacity`` entries). Before scheduling, each
    candidate's match = the request's unique items found in its LRU (a lookup does not
    refresh recency); after the pick the LRU of every endpoint picked gains every item: the
    primary pick (as llm-d) and, ours, the picks of the other profiles that ran - in E/PD and
    E/P/D the encode pod encoded the items and the prefill pod loaded them into its encoder
    cache, so an ``mm-embeddings-cache-scorer`` in the encode profile finds them (llm-d
    records the primary pick only, the decode pod, which never holds them there). An
    endpoint's LRU is dropped when it leaves the pool (and on its ``deleted`` event when the
    producer is an extractor of ``endpoint-notification-source``, as llm-d's config lists
    it)."""

    type_name = "mm-embeddings-cache-producer"
    parameters_type = MMEmbeddingsCacheProducerParameters
    params: MMEmbeddingsCacheProducerParameters

    def __init__(self, name: str = "",
                 params: MMEmbeddingsCacheProducerParameters | None = None) -> None:
        super().__init__(name, params or MMEmbeddingsCacheProducerParameters())
        self.capacity = self.params.capacity
        self._caches: dict[str, OrderedDict[str, None]] = {}

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> MMEmbeddingsCacheProducer:
        p: MMEmbeddingsCacheProducerParameters = params
        if p.cache_size_in_mb and not p.cache_size_in_mb_per_server:
            log.warning("cacheSizeInMB is llm-d's sample-config spelling, which llm-d "
                        "ignores; taken here as cacheSizeInMBPerServer", plugin=name)
        return cls(name, params)

    @property
    def _state_key(self) -> str:
        return f"{self.name}/match"

    def match(self, request: LLMRequest) -> EncoderCacheMatch:
        """The match :meth:`produce` made for ``request`` (none: no multimodal items)."""
        found = request.plugin_state.get(self._state_key)
        return found if isinstance(found, EncoderCacheMatch) else _NO_MATCH

    def produce(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        if not request.mm_items:
            return
        items = unique_items(request.mm_items)
        matched: dict[str, int] = {}
        for v in endpoints:
            cache = self._caches.get(v.key)
            hits = sum(1 for i in items if i.hash in cache) if cache else 0
            if hits:
                matched[v.key] = hits
            m.ENCODER_CACHE_HIT_RATIO.labels(self.type_name, self.name).observe(
                hits / len(items))
        for item in items:
            m.ENCODER_CACHE_QUERIES.labels(self.type_name, self.name, item.modality).inc()
            for key, cache in self._caches.items():
                if item.hash in cache:
                    m.ENCODER_CACHE_HITS.labels(self.type_name, self.name, key,
                                                item.modality).inc()
        request.plugin_state[self._state_key] = EncoderCacheMatch(items, matched)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        match = self.match(request)
        if not match.items:
            return
        for target in {v.key: v for r in result.results.values() for v in r.picked}.values():
            cache = self._caches.setdefault(target.key, OrderedDict())
            for item in match.items:
                cache[item.hash] = None
                cache.move_to_end(item.hash)
            while len(cache) > self.capacity:
                cache.popitem(last=False)

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        for key in [k for k in self._caches if k not in keys]:
            del self._caches[key]

    def on_endpoint_event(self, event: EndpointEvent) -> None:
        if event.kind is EventKind.DELETED:
            self._caches.pop(event.endpoint.key, None)

    def items_held(self, key: str) -> int:
        """Items remembered for endpoint ``key``."""
        return len(self._caches.get(key, ()))
