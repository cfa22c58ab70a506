"""``precise-prefix-cache-scorer``: prefer endpoints whose KV cache really holds the
prompt's leading blocks, as their own KV events say (llm-d's scorer of the same name).

The scorer owns a :class:`epp.kvcache.KVBlockIndex` fed by the servers' KV events, in
llm-d's two socket modes: ``discoverPods`` - one subscriber per pool endpoint, connecting to
``tcp://<endpoint ip>:<socketPort>`` -, and ``zmqEndpoint`` - one socket bound here that
every server's publisher connects to, the endpoint named by the topic. It is an extractor of
``endpoint-notification-source``: endpoints joining the pool get a subscriber (or are
recognised on the bound socket), leaving ones lose it and their blocks. Scores need the
prompt's token ids (``token-producer``); score = leading blocks the endpoint holds / full
blocks of the prompt.

When it cannot be precise it scores like the approximate ``prefix-cache-scorer`` (which
learns from every pick all along) and says so - a warning when that starts, and
``inference_extension_precise_prefix_fallback_total{reason}``: for the candidates whose event
stream is down (the others keep their precise scores), or for all when the request has no
token ids.
"""

from __future__ import annotations

import asyncio
import time
from argparse import ArgumentTypeError
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import structlog
from prometheus_client import REGISTRY, Counter

from epp.datalayer.endpoint_notification import EndpointSetExtractor
from epp.datastore import EndpointView
from epp.kvcache import IndexConfig, KVBlockIndex, KVEventMetrics
from epp.kvcache.metrics import track
from epp.kvcache.subscriber import (
    KVEventCollector,
    KVEventSource,
    KVEventSubscriptions,
    SubscriberConfig,
    cancel_task,
)
from epp.requestcontrol.plugin import PreRequest
from epp.scheduling.plugin import EndpointsRemoved, Plugin, SchedulerHooks, Scorer
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer, PrefixCacheParameters
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from shared.flags import duration
from shared.plugins import Duration

log = structlog.get_logger(__name__)

#: Root of the keys of base-model blocks: a pool serves one base model, so its name does not
#: need to be known (adapter blocks are rooted at the adapter's name, on both sides).
BASE_MODEL_KEY = ""


_TWO_SECONDS = Duration(2.0)
#: Speculative entries kept at most (oldest dropped first): bounded memory.
MAX_SPECULATIVE_KEYS = 200_000

# -- parameters (llm-d's shape) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenProcessorConfig:
    """``blockSize``: tokens per KV block, must equal the servers' ``--block-size``.
    ``hashSeed``: accepted for llm-d configs; not needed here (see docs/precise-prefix.md:
    the index keys blocks by their token ids, whatever the servers' hash seed).
    ``blockSizeTokens`` is llm-d v0.10's name of ``blockSize``."""

    ALIASES: ClassVar[dict[str, str]] = {"blockSizeTokens": "block_size"}

    block_size: int = 16
    hash_seed: str = ""

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError("tokenProcessorConfig.blockSize: must be > 0")


@dataclass(frozen=True, slots=True)
class InMemoryConfig:
    """``size``: request keys (distinct blocks) kept; ``podCacheSize``: endpoints per key."""

    size: int = 1_000_000
    pod_cache_size: int = 10


@dataclass(frozen=True, slots=True)
class KVBlockIndexConfig:
    """Only the in-memory index exists here (llm-d's Redis/cost-aware backends: refused).
    ``enableMetrics``: the Prometheus series are always exported; with it,
    ``metricsLoggingInterval`` (nanoseconds as an integer, as llm-d's samples write it, or a
    Go duration string; 0: off) also logs the index's figures at that interval."""

    in_memory_config: InMemoryConfig = field(default_factory=InMemoryConfig)
    enable_metrics: bool = True
    metrics_logging_interval: int | str = 0

    def __post_init__(self) -> None:
        self.logging_interval()  # refuse a bad value at load

    def logging_interval(self) -> float:
        """Seconds between index log lines; 0 when they are off."""
        value = self.metrics_logging_interval
        if isinstance(value, str):
            try:
                seconds = duration(value)
            except ArgumentTypeError as e:
                raise ValueError(f"indexerConfig.kvBlockIndexConfig.metricsLoggingInterval: "
                                 f"{e}") from None
        else:
            seconds = value / 1e9
        if seconds < 0:
            raise ValueError("indexerConfig.kvBlockIndexConfig.metricsLoggingInterval: "
                             "must be >= 0")
        return seconds if self.enable_metrics else 0.0


@dataclass(frozen=True, slots=True)
class IndexerConfig:
    kv_block_index_config: KVBlockIndexConfig = field(default_factory=KVBlockIndexConfig)


@dataclass(frozen=True, slots=True)
class PodDiscoveryConfig:
    """``socketPort``: the port every endpoint publishes on (llm-d). Ours: ``socketPortOffset``
    (publish port = endpoint port + offset, for several servers on one host, such as the
    simulator's ``--ports``), and the replay socket (``replaySocketPort`` or
    ``replaySocketPortOffset``, at the endpoint's IP, in both socket modes; none: gaps are
    resynced)."""

    socket_port: int = 5556
    socket_port_offset: int | None = None
    replay_socket_port: int | None = None
    replay_socket_port_offset: int | None = None


#: llm-d's endpoint for the bound socket when ``discoverPods: false`` names none.
DEFAULT_ZMQ_ENDPOINT = "tcp://*:5557"


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """``topicFilter``: topic prefix subscribed to (llm-d's default ``kv@``; vLLM's default
    topic is empty, so set ``""`` for servers started without a topic). ``concurrency`` is
    accepted (events are decoded on the event loop here).

    Socket modes (llm-d's): ``discoverPods`` connects one subscriber to each endpoint;
    ``zmqEndpoint`` binds one socket the servers' publishers connect to. Unset
    ``discoverPods`` means true unless a ``zmqEndpoint`` is given; ``discoverPods: false``
    without one binds llm-d's default ``tcp://*:5557``; both given run both, as llm-d does.
    """

    zmq_endpoint: str = ""
    topic_filter: str = "kv@"
    concurrency: int = 4
    discover_pods: bool | None = None
    pod_discovery_config: PodDiscoveryConfig = field(default_factory=PodDiscoveryConfig)

    def __post_init__(self) -> None:
        if self.zmq_endpoint:
            check_bind_address(self.zmq_endpoint)
        if self.concurrency <= 0:
            raise ValueError("kvEventsConfig.concurrency: must be > 0")

    @property
    def discovering(self) -> bool:
        """Whether one subscriber connects to each endpoint."""
        return self.discover_pods if self.discover_pods is not None else not self.zmq_endpoint

    @property
    def bind_address(self) -> str | None:
        """Where the bound socket listens, or None when there is none."""
        if self.zmq_endpoint:
            return self.zmq_endpoint
        return DEFAULT_ZMQ_ENDPOINT if self.discover_pods is False else None


def check_bind_address(address: str) -> None:
    """Refuse what ZMQ could never bind: ``tcp://<host|*>:<port|*>`` or ``ipc://<path>``."""
    where = f"kvEventsConfig.zmqEndpoint: {address!r}"
    if address.startswith("ipc://") and len(address) > len("ipc://"):
        return
    if not address.startswith("tcp://"):
        raise ValueError(f"{where}: must be tcp://<host>:<port> (or ipc://<path>)")
    host, sep, port = address[len("tcp://"):].rpartition(":")
    if not sep or not host:
        raise ValueError(f"{where}: missing host or port")
    if port != "*" and not (port.isdigit() and int(port) <= 65535):
        raise ValueError(f"{where}: port must be 0-65535 or *")


@dataclass(frozen=True, slots=True)
class PrecisePrefixCacheParameters:
    ALIASES: ClassVar[dict[str, str]] = {"speculativeTTL": "speculative_ttl"}

    token_processor_config: TokenProcessorConfig = field(default_factory=TokenProcessorConfig)
    indexer_config: IndexerConfig = field(default_factory=IndexerConfig)
    kv_events_config: KVEventsConfig = field(default_factory=KVEventsConfig)
    #: llm-d's: at the pick, count the picked endpoint as holding the prompt's blocks for
    #: ``speculativeTTL`` (until its own events can say so).
    speculative_indexing: bool = False
    speculative_ttl: Duration = _TWO_SECONDS

    def __post_init__(self) -> None:
        if self.speculative_ttl <= 0:
            raise ValueError("speculativeTTL: must be > 0")


# -- metrics --------------------------------------------------------------------------------

#: One set of KV-event series per process (every scorer of every build shares them).
KV_EVENT_METRICS = KVEventMetrics(REGISTRY)
FALLBACKS = Counter("inference_extension_precise_prefix_fallback_total",
                    "Requests the precise prefix scorer scored approximately, by reason "
                    "(no_stream: a candidate's KV-event stream is down; no_tokens: the "
                    "request has no token ids).", ["reason"])


# -- the plugin -----------------------------------------------------------------------------


class PrecisePrefixCache(Plugin, EndpointSetExtractor, PreRequest, EndpointsRemoved):
    """The KV-event index and its per-endpoint match (see the module docstring); the scorer
    below and ``precise-prefix-cache-producer`` (llm-d v0.10's split) are this plus their
    extension point."""

    parameters_type = PrecisePrefixCacheParameters
    params: PrecisePrefixCacheParameters

    def __init__(self, name: str = "", params: PrecisePrefixCacheParameters | None = None,
                 subscriber_config: SubscriberConfig | None = None) -> None:
        super().__init__(name, params)
        p = self.params
        mem = p.indexer_config.kv_block_index_config.in_memory_config
        self.block_size = p.token_processor_config.block_size
        self.index = KVBlockIndex(IndexConfig(block_size=self.block_size, max_keys=mem.size,
                                              max_endpoints_per_key=mem.pod_cache_size))
        track(self.index)
        kv = p.kv_events_config
        #: Per-endpoint subscribers (``discoverPods``; none when it is off).
        self.subscriptions: KVEventSubscriptions | None = None
        if kv.discovering:
            self.subscriptions = KVEventSubscriptions(self.index, KV_EVENT_METRICS,
                                                      subscriber_config, on_cold=self.forget)
        #: The bound socket (``zmqEndpoint``; none without it).
        self.collector: KVEventCollector | None = None
        if kv.bind_address is not None:
            self.collector = KVEventCollector(kv.bind_address, self.index, KV_EVENT_METRICS,
                                              subscriber_config, on_cold=self.forget,
                                              topic_filter=kv.topic_filter)
        self._pool: frozenset[str] = frozenset()
        #: Seconds between index log lines (``metricsLoggingInterval``; 0: none).
        self.log_interval = p.indexer_config.kv_block_index_config.logging_interval()
        self._log_task: asyncio.Task[None] | None = None
        #: The approximate fallback, learning from every pick (token blocks of the same size).
        self.approx = ApproxPrefixCacheProducer(
            f"{self.name}/approx", PrefixCacheParameters(block_size_tokens=self.block_size))
        self._hooks = SchedulerHooks()
        self._degraded: str | None = None
        #: request key -> {endpoint: expiry (monotonic)}, when speculativeIndexing is on.
        self.speculative: OrderedDict[int, dict[str, float]] = OrderedDict()

    def attach(self, hooks: SchedulerHooks) -> None:
        self._hooks = hooks

    # -- endpoints ---------------------------------------------------------------------------
    def source_for(self, view: EndpointView) -> KVEventSource:
        """Where ``view``'s endpoint publishes its KV events."""
        ep = view.endpoint
        d = self.params.kv_events_config.pod_discovery_config
        host = f"[{ep.address}]" if ":" in ep.address else ep.address
        port = d.socket_port if d.socket_port_offset is None else ep.port + d.socket_port_offset
        replay = d.replay_socket_port
        if d.replay_socket_port_offset is not None:
            replay = ep.port + d.replay_socket_port_offset
        return KVEventSource(
            endpoint=ep.key, address=f"tcp://{host}:{port}", model=BASE_MODEL_KEY,
            replay_address=f"tcp://{host}:{replay}" if replay is not None else None,
            topic_filter=self.params.kv_events_config.topic_filter)

    def open(self) -> None:
        """Bind the ``zmqEndpoint`` socket (before the EPP serves; a failure refuses to start
        with a message naming the parameter)."""
        if self.collector is not None:
            self.collector.bind()

    async def endpoints_changed(self, endpoints: Sequence[EndpointView]) -> None:
        sources = [self.source_for(v) for v in endpoints]
        self._pool = frozenset(s.endpoint for s in sources)
        if self.subscriptions is not None:
            await self.subscriptions.sync(sources)
        if self.collector is not None:
            await self.collector.sync(sources)
            self.collector.start()
        if self.log_interval and self._log_task is None:
            self._log_task = asyncio.get_running_loop().create_task(self._log_index())

    async def _log_index(self) -> None:
        """llm-d's ``metricsLoggingInterval``: the index's figures in the log, periodically."""
        while True:
            await asyncio.sleep(self.log_interval)
            blocks = self.index.endpoint_blocks()
            log.info("kv index", scorer=self.name, keys=len(self.index),
                     estimated_bytes=self.index.estimated_bytes(), endpoints=len(blocks),
                     blocks=dict(sorted(blocks.items())[:32]))

    async def close(self) -> None:
        await cancel_task(self._log_task)
        self._log_task = None
        if self.subscriptions is not None:
            await self.subscriptions.stop()
        if self.collector is not None:
            await self.collector.stop()

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        self.approx.retain_endpoints(keys)

    def forget(self, key: str) -> None:
        """``key``'s cache is presumed cold (its event stream was lost or its publisher
        restarted): drop the guesses about it too - the approximate fallback's picks and the
        speculative entries - so a restarted server is not scored warm from its past life."""
        self.approx.retain_endpoints(self._pool - {key})
        for eps in self.speculative.values():
            eps.pop(key, None)

    # -- scoring ---------------------------------------------------------------------------
    def live(self, key: str) -> bool:
        """Whether ``key``'s event stream is up (its index entries can be trusted): its
        subscriber is connected, or its publisher has been heard on the bound socket."""
        subs, collector = self.subscriptions, self.collector
        return bool((subs is not None and subs.live(key))
                    or (collector is not None and collector.live(key)))

    def fractions(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> list[float]:
        """Per endpoint: leading blocks it holds / full blocks of the prompt."""
        ids = request.prompt_token_ids
        if ids is None:
            return self._fallback("no_tokens", request, endpoints)
        down = [i for i, v in enumerate(endpoints) if not self.live(v.endpoint.key)]
        if len(down) == len(endpoints):
            return self._fallback("no_stream", request, endpoints, down)
        blocks = len(ids) // self.block_size
        keys = self.index.request_keys(list(ids), request.lora_adapter or BASE_MODEL_KEY)
        matched = self.index.score_keys(keys) if keys else {}
        if self.params.speculative_indexing and keys:
            for ep, n in self._speculative_match(keys).items():
                if n > matched.get(ep, 0):
                    matched[ep] = n
        request.plugin_state[self.name] = (keys, matched)
        get = matched.get
        scores = [get(v.endpoint.key, 0) / blocks if blocks else 0.0 for v in endpoints]
        if down:  # only these endpoints' streams are down: guess for them, know for the rest
            approx = self._fallback("no_stream", request, endpoints, down)
            for i in down:
                scores[i] = approx[i]
        elif self._degraded is not None:
            log.info("precise prefix scoring resumed", scorer=self.name)
            self._degraded = None
        return scores

    def _fallback(self, reason: str, request: LLMRequest, endpoints: Sequence[EndpointView],
                  down: Sequence[int] = ()) -> list[float]:
        FALLBACKS.labels(reason).inc()
        if self._degraded != reason:
            self._degraded = reason
            log.warning("precise prefix scoring degraded to approximate", scorer=self.name,
                        reason=reason,
                        endpoints_without_stream=[endpoints[i].endpoint.key for i in down][:8])
        state = self.approx.match(request)
        if not state.matched:
            return [0.0] * len(endpoints)
        total = len(state.hashes)
        return [state.matched.get(v.endpoint.key, 0) / total for v in endpoints]

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        picked = result.primary.picked
        if not picked:
            return
        self.approx.record(request, picked[0])
        state = request.plugin_state.get(self.name)
        if not isinstance(state, tuple) or not state[0]:
            return
        keys, matched = state
        ep = picked[0].endpoint.key
        if self.params.speculative_indexing:
            self._speculate(keys, ep)
        if self._hooks.prefix_hit_ratio is not None:
            self._hooks.prefix_hit_ratio(matched.get(ep, 0) / len(keys))

    # -- speculative entries ---------------------------------------------------------------
    def _speculate(self, keys: list[int], endpoint: str) -> None:
        expiry = time.monotonic() + self.params.speculative_ttl
        spec = self.speculative
        for key in keys:
            eps = spec.get(key)
            if eps is None:
                eps = spec[key] = {}
            else:
                spec.move_to_end(key)
            eps[endpoint] = expiry
        while len(spec) > MAX_SPECULATIVE_KEYS:
            spec.popitem(last=False)

    def _speculative_match(self, keys: list[int]) -> dict[str, int]:
        """Per endpoint, leading blocks it was picked for within the TTL."""
        now = time.monotonic()
        out: dict[str, int] = {}
        active: set[str] | None = None
        for i, key in enumerate(keys, start=1):
            eps = self.speculative.get(key)
            live = {ep for ep, until in eps.items() if until > now} if eps else set()
            active = live if active is None else active & live
            if not active:
                break
            for ep in active:
                out[ep] = i
        return out


class PrecisePrefixCacheScorer(PrecisePrefixCache, Scorer):
    """score = :meth:`PrecisePrefixCache.fractions` (llm-d deprecates this all-in-one type
    in v0.10 for ``precise-prefix-cache-producer`` + ``prefix-cache-scorer``)."""

    type_name = "precise-prefix-cache-scorer"
    bounded = True

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        return self.fractions(request, endpoints)


__all__ = ["DEFAULT_ZMQ_ENDPOINT", "FALLBACKS", "KV_EVENT_METRICS", "PrecisePrefixCache",
           "PrecisePrefixCacheParameters", "PrecisePrefixCacheScorer"]
