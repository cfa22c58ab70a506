"""``approx-prefix-cache-producer``: learns which prompt blocks were sent where, and before
scheduling tells ``prefix-cache-scorer`` how much of each request's prefix every endpoint
probably holds.

Approximate: the EPP does not see the servers' caches. It remembers which blocks it sent
where (after each pick) and assumes each server keeps them LRU-style.

The index lives in the handle's state store: private to this replica by default, shared by
every active-active replica with ``--state-store valkey://...`` (docs/active-active.md), so a
prefix learnt through one replica routes the same through the others.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import xxhash

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import DataProducer, PreRequest
from epp.scheduling.plugin import EndpointsRemoved, Plugin, SchedulerHooks
from epp.scheduling.request import CHARS_PER_TOKEN, LLMRequest
from epp.scheduling.result import SchedulingResult
from epp.statestore import MemoryStateStore, StateStore
from shared.plugins import Handle

_hash = xxhash.xxh64_intdigest


@dataclass(frozen=True, slots=True)
class PrefixCacheParameters:
    """Upstream parameter names.

    ``blockSize``: block length in prompt bytes (64 ~ 16 tokens; ``hashBlockSize`` is its
    older upstream name). ``blockSizeTokens``: when set, the block is this many tokens: token
    ids are hashed in blocks of that size when the request carries them, otherwise
    ``blockSizeTokens * 4`` bytes. ``autoTune``: use a server's reported ``num_gpu_blocks``
    as its LRU capacity. ``maxPrefixBlocksToMatch``: blocks hashed per request.
    ``maxPrefixTokensToMatch`` (llm-d v0.10): the same cap in tokens (blocks = tokens /
    tokens per block), winning over the block cap when > 0; both 0: the whole prompt.
    ``lruCapacityPerServer``: blocks remembered per endpoint.
    """

    ALIASES: ClassVar[dict[str, str]] = {"hashBlockSize": "block_size"}

    auto_tune: bool = True
    block_size: int = 64
    block_size_tokens: int | None = None
    max_prefix_blocks_to_match: int = 256
    #: None (not given): the block cap alone, as GIE v1.5 (llm-d v0.10 defaults it to 131072).
    max_prefix_tokens_to_match: int | None = None
    lru_capacity_per_server: int = 31_250

    def __post_init__(self) -> None:
        if self.max_prefix_blocks_to_match < 0 or (self.max_prefix_tokens_to_match or 0) < 0:
            raise ValueError("maxPrefixBlocksToMatch / maxPrefixTokensToMatch: must be >= 0")


@dataclass(slots=True)
class PrefixMatch:
    """What the producer made for one request: its block hashes and, per endpoint key, how
    many leading blocks that endpoint probably holds."""

    hashes: list[int]
    matched: dict[str, int]
    #: Whether the hashes are of token-id blocks (else of prompt bytes).
    tokens: bool = False


class ApproxPrefixCacheProducer(Plugin, DataProducer, PreRequest, EndpointsRemoved):
    """Blocks are chain-hashed: h_0 = xxh64(model + NUL + cache_salt), h_i = xxh64(block_i,
    seed=h_{i-1}), so a block's hash names the whole prefix up to it and the model (salt)
    keeps namespaces apart. Only full blocks count, at most ``maxPrefixBlocksToMatch``. A
    chat request hashes ``json(messages)``. After the pick the primary endpoint is recorded
    as holding every block.
    """

    type_name = "approx-prefix-cache-producer"
    parameters_type = PrefixCacheParameters
    params: PrefixCacheParameters

    def __init__(self, name: str = "", params: PrefixCacheParameters | None = None,
                 store: StateStore | None = None) -> None:
        super().__init__(name, params)
        #: Where the index lives (:meth:`StateStore.prefix_add` / ``prefix_match``).
        self.store = store if store is not None else MemoryStateStore()
        self._hooks = SchedulerHooks()
        self._matched_blocks = 0
        self._total_blocks = 0

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> ApproxPrefixCacheProducer:
        return cls(name, params, state_store_of(handle))

    def attach(self, hooks: SchedulerHooks) -> None:
        self._hooks = hooks

    @property
    def tokens_per_block(self) -> int:
        """Prompt tokens one index block stands for (bytes blocks: ~4 bytes a token)."""
        p = self.params
        return p.block_size_tokens or max(1, p.block_size // CHARS_PER_TOKEN)

    @property
    def indexer_size(self) -> int:
        """Entries in the index (``inference_extension_prefix_indexer_size``)."""
        return self.store.prefix_size

    @property
    def hit_ratio(self) -> float:
        """Matched / total blocks over every committed request so far (0 before any)."""
        return self._matched_blocks / self._total_blocks if self._total_blocks else 0.0

    @property
    def max_blocks(self) -> int:
        """Blocks hashed per request at most (see :class:`PrefixCacheParameters`)."""
        p = self.params
        tokens = p.max_prefix_tokens_to_match
        if tokens is None:
            return p.max_prefix_blocks_to_match
        if tokens > 0:
            return tokens // self.tokens_per_block
        return p.max_prefix_blocks_to_match or sys.maxsize

    def block_hashes(self, request: LLMRequest) -> list[int]:
        """The chained block hashes of ``request``'s prompt (see the class docstring)."""
        p = self.params
        h = _hash(f"{request.target_model}\x00{request.cache_salt}".encode())
        out: list[int] = []
        ids = request.prompt_token_ids
        if ids is not None and p.block_size_tokens:
            bs = p.block_size_tokens
            n = min(len(ids) // bs, self.max_blocks)
            packed = array("q", ids[: n * bs]).tobytes()
            step = bs * 8
            for i in range(0, n * step, step):
                h = _hash(packed[i : i + step], h)
                out.append(h)
            return out
        bs = p.block_size_tokens * CHARS_PER_TOKEN if p.block_size_tokens else p.block_size
        data = memoryview(request.prompt)
        n = min(len(data) // bs, self.max_blocks) if bs > 0 else 0
        for i in range(0, n * bs, bs):
            h = _hash(data[i : i + bs], h)
            out.append(h)
        return out

    def match(self, request: LLMRequest) -> PrefixMatch:
        """This request's :class:`PrefixMatch` (computed once, kept in its plugin state)."""
        state = request.plugin_state.get(self.name)
        tokens = request.prompt_token_ids is not None and bool(self.params.block_size_tokens)
        # Token ids may arrive after the producer step (token-producer runs at admission):
        # then the byte-block match made before is replaced by the token-block one.
        if not isinstance(state, PrefixMatch) or state.tokens != tokens:
            hashes = self.block_hashes(request)
            state = PrefixMatch(hashes, self.store.prefix_match(hashes) if hashes else {}, tokens)
            request.plugin_state[self.name] = state
        return state

    def produce(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        self.match(request)

    def uncached_tokens(self, request: LLMRequest, key: str) -> int:
        """The prompt tokens endpoint ``key`` would have to compute for ``request``: all of
        them, less the leading blocks the index says it holds."""
        cached = self.match(request).matched.get(key, 0) * self.tokens_per_block
        return max(0, request.prompt_tokens - cached)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        picked = result.primary.picked
        if picked:
            self.record(request, picked[0])
        # Under P/D the prefill endpoint computes the prompt too and keeps it cached.
        for name, other in result.results.items():
            if name != result.primary_profile and other.picked:
                self.record(request, other.picked[0], count=False)

    def record(self, request: LLMRequest, target: EndpointView, *, count: bool = True) -> None:
        """Remember that ``target`` now holds every block of ``request`` (``count``: the
        request's primary endpoint, which the hit-ratio metric follows)."""
        state = self.match(request)
        if not state.hashes:
            return
        key = target.endpoint.key
        capacity = self.params.lru_capacity_per_server
        if self.params.auto_tune and target.metrics.num_gpu_blocks:
            capacity = target.metrics.num_gpu_blocks
        hit = state.matched.get(key, 0)
        self.store.prefix_add(key, state.hashes, capacity)
        if not count:
            return
        self._matched_blocks += hit
        self._total_blocks += len(state.hashes)
        if self._hooks.prefix_hit_ratio is not None:
            self._hooks.prefix_hit_ratio(hit / len(state.hashes))
        if self._hooks.prefix_hit_bytes is not None:
            p = self.params
            block = p.block_size_tokens * CHARS_PER_TOKEN if p.block_size_tokens else p.block_size
            self._hooks.prefix_hit_bytes(hit * block)

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        self.store.prefix_retain(keys)


class UncachedTokens:
    """``(request, endpoint key) -> the prompt tokens that endpoint would compute``: all of
    them, less the leading blocks the config's approximate prefix producer says it holds (the
    whole prompt without one). The producer is looked up at the first call: it may be created
    after the plugin that asks."""

    def __init__(self, handle: Handle | None) -> None:
        self._handle = handle
        self._producer: list[ApproxPrefixCacheProducer] | None = None

    def __call__(self, request: LLMRequest, key: str) -> int:
        if self._producer is None:
            found = self._handle.find(ApproxPrefixCacheProducer) if self._handle else []
            self._producer = list(found)
        if not self._producer:
            return request.prompt_tokens
        return self._producer[0].uncached_tokens(request, key)


def state_store_of(handle: Handle) -> StateStore | None:
    """The EPP handle's state store (None for another service's handle)."""
    store = getattr(handle, "state_store", None)
    return store if isinstance(store, StateStore) else None
