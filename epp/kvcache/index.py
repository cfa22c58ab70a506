"""Which endpoint holds which KV block: the index behind precise prefix-cache scoring.

Keys. Each model server hashes blocks its own way (vLLM: sha256 over pickle by default, with
a seed the EPP may not know). So, as llm-d's kv-cache indexer does, the index keeps its own
*request keys*, computed from the token ids every ``BlockStored`` event carries, and a
per-endpoint map *engine hash → request key* so ``BlockRemoved`` (which only names engine
hashes) can be applied exactly. The scorer hashes a prompt's token ids the same way, so its
keys match the events' keys whatever ``--prefix-caching-hash-algo`` or ``PYTHONHASHSEED`` the
servers run with.

Request key of block ``i`` = ``xxh3_64(uint32-LE token ids of block i, seed = key of block
i-1)``; the seed of block 0 is ``xxh3_64(model)`` where ``model`` is the LoRA adapter's name
for adapter traffic, else the base model's name, so adapters never share blocks with their
base (LoRA-aware keys). ``cache_salt`` is not part of the key: a salted request's blocks are
indexed under the unsalted key (a request for the same tokens with another salt would be
over-scored; salts are rare in routing).

Memory is bounded: at most ``max_keys`` request keys (least recently stored evicted first),
each naming at most ``max_endpoints_per_key`` endpoints (oldest dropped first), and at most
``max_keys`` engine hashes per endpoint. Measured worst case (``python -m bench.micro kv-index``,
nothing ever removed): about 310 bytes per request key plus 130 bytes per engine hash, i.e.
``max_keys * (310 + 130 * endpoints)`` bytes; in practice an endpoint's engine hashes stay
near its real cache size, since its ``BlockRemoved`` events remove them.
:meth:`KVBlockIndex.estimated_bytes` turns the live counts into bytes with
:data:`KEY_BYTES` and :data:`HASH_BYTES` (fitted with ``tracemalloc`` on CPython 3.11 to
indexes with one and with four endpoints per key; within ~15% of it).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass

import xxhash

from modelserver.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, Event, hash_to_u64

_xxh = xxhash.xxh3_64_intdigest

#: Bytes per request key (its entry and its endpoint map) and per engine hash (its entry and
#: the endpoint's slot in the key's map), for :meth:`KVBlockIndex.estimated_bytes`.
KEY_BYTES = 290
HASH_BYTES = 120


class UnindexableEvent(ValueError):
    """An event that is well-formed but cannot be applied (its ``reason`` labels metrics)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(slots=True)
class IndexConfig:
    """Parameters of :class:`KVBlockIndex` (llm-d: ``blockSize``, ``size``, ``podCacheSize``)."""

    block_size: int = 16
    max_keys: int = 1_000_000
    max_endpoints_per_key: int = 10

    def __post_init__(self) -> None:
        for name in ("block_size", "max_keys", "max_endpoints_per_key"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


class KVBlockIndex:
    """Request key → endpoints holding that block, fed by KV events, queried by ``score``.

    Not thread-safe: subscribers and the scorer share one event loop.
    """

    def __init__(self, config: IndexConfig | None = None) -> None:
        self.config = config or IndexConfig()
        self._keys: OrderedDict[int, dict[str, None]] = OrderedDict()
        self._engine: dict[str, dict[int, int]] = {}
        self._roots: dict[str, int] = {}
        self.evicted_keys = 0

    # -- queries -------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of request keys held."""
        return len(self._keys)

    def endpoint_blocks(self) -> dict[str, int]:
        """Blocks known per endpoint (engine hashes tracked)."""
        return {ep: len(m) for ep, m in self._engine.items()}

    def estimated_bytes(self) -> int:
        """The index's memory, estimated from its entry counts (cheap: one sum per
        endpoint)."""
        hashes = sum(len(m) for m in self._engine.values())
        return KEY_BYTES * len(self._keys) + HASH_BYTES * hashes

    def request_keys(self, token_ids: list[int], model: str) -> list[int]:
        """Request keys of every full block of ``token_ids`` (the scorer's keys)."""
        bs = self.config.block_size
        n = len(token_ids) // bs
        if n == 0:
            return []
        return self._chain(self._root(model), token_ids[: n * bs], n)

    def score(self, token_ids: list[int], model: str) -> dict[str, int]:
        """Per endpoint, how many leading blocks of the prompt it holds (absent = 0)."""
        return self.score_keys(self.request_keys(token_ids, model))

    def score_keys(self, keys: list[int]) -> dict[str, int]:
        """Per endpoint, the length of the longest prefix of ``keys`` it holds."""
        scores: dict[str, int] = {}
        active: set[str] | None = None
        index = self._keys
        for i, key in enumerate(keys, start=1):
            eps = index.get(key)
            if not eps:
                break
            active = set(eps) if active is None else active.intersection(eps)
            if not active:
                break
            for ep in active:
                scores[ep] = i
        return scores

    # -- updates ---------------------------------------------------------------------------
    def apply(self, endpoint: str, event: Event, model: str) -> int:
        """Apply one event from ``endpoint`` (base model ``model``); returns blocks touched.

        Raises :class:`UnindexableEvent` for a ``BlockStored`` whose block size differs from
        the index's, whose parent block is unknown here, or whose token ids are not uint32.
        """
        if isinstance(event, BlockStored):
            return self._stored(endpoint, event, model)
        if isinstance(event, BlockRemoved):
            return self._removed(endpoint, event.block_hashes)
        if isinstance(event, AllBlocksCleared):
            return self.clear_endpoint(endpoint)
        raise UnindexableEvent("unknown_event", type(event).__name__)  # pragma: no cover

    def clear_endpoint(self, endpoint: str) -> int:
        """Forget everything ``endpoint`` holds (cleared cache, restart, lost sync)."""
        engine = self._engine.pop(endpoint, None)
        if not engine:
            return 0
        index = self._keys
        for key in engine.values():
            eps = index.get(key)
            if eps is not None and endpoint in eps:
                del eps[endpoint]
                if not eps:
                    del index[key]
        return len(engine)

    # -- internals -------------------------------------------------------------------------
    def _root(self, model: str) -> int:
        root = self._roots.get(model)
        if root is None:
            if len(self._roots) > 10_000:  # model names come from the wire: keep this bounded
                self._roots.clear()
            root = self._roots[model] = _xxh(model.encode())
        return root

    def _chain(self, parent: int, token_ids: list[int], n: int) -> list[int]:
        try:
            raw = memoryview(array("I", token_ids)).cast("B")
        except OverflowError:
            raise UnindexableEvent("bad_token_ids", "token id outside uint32") from None
        step = self.config.block_size * 4
        keys = []
        for i in range(n):
            parent = _xxh(raw[i * step : (i + 1) * step], parent)
            keys.append(parent)
        return keys

    def _stored(self, endpoint: str, ev: BlockStored, model: str) -> int:
        cfg = self.config
        if ev.block_size != cfg.block_size:
            raise UnindexableEvent(
                "block_size", f"event block size {ev.block_size}, index {cfg.block_size}")
        engine = self._engine.get(endpoint)
        if engine is None:
            engine = self._engine[endpoint] = {}
        if ev.parent_block_hash is None:
            parent = self._root(ev.lora_name or model)
        else:
            known = engine.get(hash_to_u64(ev.parent_block_hash))
            if known is None:
                raise UnindexableEvent("unknown_parent", "parent block was never stored here")
            parent = known
        keys = self._chain(parent, ev.token_ids, len(ev.block_hashes))
        index = self._keys
        for engine_hash, key in zip(ev.block_hashes, keys, strict=True):
            engine[hash_to_u64(engine_hash)] = key
            eps = index.get(key)
            if eps is None:
                eps = index[key] = {}
            else:
                index.move_to_end(key)
                eps.pop(endpoint, None)
            eps[endpoint] = None
            if len(eps) > cfg.max_endpoints_per_key:
                del eps[next(iter(eps))]
        while len(index) > cfg.max_keys:
            index.popitem(last=False)
            self.evicted_keys += 1
        while len(engine) > cfg.max_keys:
            del engine[next(iter(engine))]
        return len(keys)

    def _removed(self, endpoint: str, hashes: list[int | bytes]) -> int:
        engine = self._engine.get(endpoint)
        if not engine:
            return 0
        index = self._keys
        n = 0
        for h in hashes:
            key = engine.pop(hash_to_u64(h), None)
            if key is None:
                continue
            n += 1
            eps = index.get(key)
            if eps is not None and endpoint in eps:
                del eps[endpoint]
                if not eps:
                    del index[key]
        return n
