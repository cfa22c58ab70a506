"""``burst-prefix-cache-producer`` (llm-d-router v0.10): co-locate bursts of requests that
share a prompt (the ``n`` samples of an RL rollout step, fan-outs) so the shared prefix is
prefilled once instead of on every replica of a cold pool.

Requests arriving within ``windowDurationMs`` are placed together (each waits until its window
closes: the producer runs at the director's awaitable admission step). It publishes, like the
approximate producer, a prefix match per request: the whole prompt on the assigned replica,
nothing elsewhere; point ``prefix-cache-scorer`` at it (``prefixMatchInfoProducerName``, or it
is the config's only prefix producer). It learns nothing across windows: pair it with
``approx-prefix-cache-producer`` for warm-cache reuse.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import Admitter
from epp.scheduling.plugins.prefix.producer import (
    ApproxPrefixCacheProducer,
    PrefixCacheParameters,
    PrefixMatch,
)
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult

log = structlog.get_logger(__name__)

#: Upstream's block cap when ``maxPrefixTokensToMatch`` is 0.
DEFAULT_MAX_PREFIX_BLOCKS = 256
MAX_WINDOW_MS = 10_000


@dataclass(frozen=True, slots=True)
class BurstParameters:
    """Upstream's names and defaults: ``windowDurationMs`` 100 (1-10000), ``maxPerReplica``
    -1 (unlimited), ``blockSizeTokens`` 64, ``maxPrefixTokensToMatch`` 0 (the default cap of
    256 blocks), ``minColocateBlocks`` 0, ``maxBatchSize`` 1000 (-1 unlimited), ``balanceBy``
    ``requests`` | ``tokens``."""

    window_duration_ms: int = 100
    max_per_replica: int = -1
    block_size_tokens: int = 64
    max_prefix_tokens_to_match: int = 0
    min_colocate_blocks: int = 0
    max_batch_size: int = 1000
    balance_by: Literal["requests", "tokens"] = "requests"

    def __post_init__(self) -> None:
        if not 0 < self.window_duration_ms <= MAX_WINDOW_MS:
            raise ValueError(f"windowDurationMs must be in 1..{MAX_WINDOW_MS}, got "
                             f"{self.window_duration_ms}")
        if self.max_per_replica != -1 and self.max_per_replica < 1:
            raise ValueError("maxPerReplica must be -1 (unlimited) or >= 1")
        if self.block_size_tokens <= 0:
            raise ValueError("blockSizeTokens must be > 0")
        if self.max_prefix_tokens_to_match < 0 or 0 < self.max_prefix_tokens_to_match < \
                self.block_size_tokens:
            raise ValueError("maxPrefixTokensToMatch must be 0 or >= blockSizeTokens (a "
                             "smaller value yields no prefix block)")
        if self.min_colocate_blocks < 0:
            raise ValueError("minColocateBlocks must be >= 0")
        if self.max_batch_size != -1 and self.max_batch_size < 1:
            raise ValueError("maxBatchSize must be -1 (unlimited) or >= 1")

    @property
    def max_blocks(self) -> int:
        """Blocks hashed per request at most."""
        if self.max_prefix_tokens_to_match:
            return self.max_prefix_tokens_to_match // self.block_size_tokens
        return DEFAULT_MAX_PREFIX_BLOCKS


@dataclass(slots=True)
class Entry:
    """One request waiting in a window."""

    request: LLMRequest
    hashes: list[int]
    pods: Sequence[EndpointView]
    assigned: EndpointView | None = None


@dataclass(slots=True)
class Window:
    """The requests of one window and the event that ends it."""

    entries: list[Entry] = field(default_factory=list)
    sealed: asyncio.Event = field(default_factory=asyncio.Event)


def leading_shared(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading blocks ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def assign(entries: list[Entry], max_per_replica: int, min_colocate: int,
           by_tokens: bool) -> None:
    """Place the window's units on replicas (sets ``Entry.assigned``).

    Units: requests with an identical prompt prefix (more than one of them), kept whole up
    to ``max_per_replica`` per replica; and, with ``min_colocate`` > 0, single requests sharing
    at least that many leading blocks with another request of the window. Identical groups
    go first, longer prefixes first. A group fills the least-loaded replica up to
    ``max_per_replica`` and spills to the next least-loaded one. A single unit goes to a
    replica already holding a unit sharing ≥ ``min_colocate`` leading blocks with it (the
    longest share first) while that replica is under its fair share of the window, else to
    the least-loaded replica. Load is requests, or with ``by_tokens`` prefix blocks, a
    unit's prefix charged once per replica less the leading blocks already there.
    """
    replicas: dict[str, EndpointView] = {}
    for e in entries:
        for v in e.pods:
            replicas.setdefault(v.key, v)
    if not replicas:
        return
    order = {k: i for i, k in enumerate(replicas)}
    groups: dict[tuple[int, ...], list[Entry]] = {}
    for e in entries:
        if e.hashes:
            groups.setdefault(tuple(e.hashes), []).append(e)
    identical = [g for g in groups.values() if len(g) > 1]
    singles = [g[0] for g in groups.values() if len(g) == 1]
    if min_colocate > 0:
        prefixed = [e for e in singles if any(
            o is not e and leading_shared(e.hashes, o.hashes) >= min_colocate
            for o in entries if o.hashes)]
    else:
        prefixed = []
    identical.sort(key=lambda g: -len(g[0].hashes))
    prefixed.sort(key=lambda e: -len(e.hashes))
    load = dict.fromkeys(replicas, 0.0)
    placed: dict[str, list[list[int]]] = {k: [] for k in replicas}

    def charge(key: str, hashes: list[int], requests: int) -> None:
        if by_tokens:
            held = max((leading_shared(hashes, h) for h in placed[key]), default=0)
            load[key] += len(hashes) - held
        else:
            load[key] += requests
        placed[key].append(hashes)

    def least_loaded(keys: Sequence[str]) -> str:
        return min(keys, key=lambda k: (load[k], order[k]))

    for group in identical:
        allowed = [v.key for v in group[0].pods if v.key in replicas] or list(replicas)
        remaining = list(group)
        used: list[str] = []
        while remaining:
            fresh = [k for k in allowed if k not in used] or allowed
            key = least_loaded(fresh)
            take = remaining if max_per_replica == -1 else remaining[:max_per_replica]
            for e in take:
                e.assigned = replicas[key]
            charge(key, group[0].hashes, len(take))
            used.append(key)
            remaining = remaining[len(take):]
    total = sum(len(g) for g in identical) + len(prefixed)
    if by_tokens:
        total_load = sum(load.values()) + sum(len(e.hashes) for e in prefixed)
        fair = math.ceil(total_load / len(replicas))
    else:
        fair = math.ceil(total / len(replicas))
    for e in prefixed:
        allowed = [v.key for v in e.pods if v.key in replicas] or list(replicas)
        near = [(max((leading_shared(e.hashes, h) for h in placed[k]), default=0), k)
                for k in allowed if load[k] < fair]
        near = [(n, k) for n, k in near if n >= min_colocate]
        key = (max(near, key=lambda nk: (nk[0], -load[nk[1]], -order[nk[1]]))[1]
               if near else least_loaded(allowed))
        e.assigned = replicas[key]
        charge(key, e.hashes, 1)


class BurstPrefixCacheProducer(ApproxPrefixCacheProducer, Admitter):
    """See the module docstring; the placement is :func:`assign`. The match it publishes:
    matched(e) = every prompt block on the assigned replica, 0 elsewhere (no assignment:
    0 everywhere)."""

    type_name = "burst-prefix-cache-producer"
    parameters_type = BurstParameters  # type: ignore[assignment]
    params: BurstParameters  # type: ignore[assignment]

    def __init__(self, name: str = "", params: Any = None, store: Any = None) -> None:
        super().__init__(name, params or BurstParameters(), store)  # type: ignore[arg-type]
        p = self.params
        self._hasher = ApproxPrefixCacheProducer(f"{self.name}/hash", PrefixCacheParameters(
            auto_tune=False, block_size_tokens=p.block_size_tokens,
            max_prefix_blocks_to_match=p.max_blocks))
        self._window: Window | None = None
        self.windows = 0

    @property
    def tokens_per_block(self) -> int:
        return self.params.block_size_tokens

    @property
    def max_blocks(self) -> int:
        """Blocks hashed per request at most."""
        return self.params.max_blocks

    def block_hashes(self, request: LLMRequest) -> list[int]:
        return self._hasher.block_hashes(request)

    def match(self, request: LLMRequest) -> PrefixMatch:
        state = request.plugin_state.get(self.name)
        if isinstance(state, PrefixMatch):
            return state
        return PrefixMatch(self.block_hashes(request), {})  # not placed: no affinity

    def produce(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        """Nothing before admission: the match is made when the request's window closes."""

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        """Nothing to learn: placement lives for one window only."""

    def record(self, request: LLMRequest, target: EndpointView, *, count: bool = True) -> None:
        """Nothing to learn (see :meth:`pre_request`)."""

    def admit(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Any:
        p = self.params
        window = self._window
        if window is None:
            window = self._window = Window()
            asyncio.get_running_loop().call_later(p.window_duration_ms / 1000.0,
                                                  self._seal, window)
        if p.max_batch_size != -1 and len(window.entries) >= p.max_batch_size:
            log.warning("burst-prefix-cache-producer: window full, request placed alone",
                        producer=self.name, max_batch_size=p.max_batch_size)
            return None
        entry = Entry(request, self.block_hashes(request), list(endpoints))
        window.entries.append(entry)
        return self._wait(window, entry)

    async def _wait(self, window: Window, entry: Entry) -> None:
        await window.sealed.wait()
        hashes = entry.hashes
        matched = {entry.assigned.key: len(hashes)} if entry.assigned is not None else {}
        entry.request.plugin_state[self.name] = PrefixMatch(hashes, matched)

    def _seal(self, window: Window) -> None:
        if self._window is window:
            self._window = None
        self.windows += 1
        p = self.params
        assign(window.entries, p.max_per_replica, p.min_colocate_blocks,
               p.balance_by == "tokens")
        window.sealed.set()
