"""Paged KV cache with prefix reuse, as vLLM's block manager does it (counts, not tensors).

Blocks are either *referenced* by running requests or *free*. Free blocks that still hold a
full prompt block keep their hash and sit in an LRU list, so a later request with the same
prefix can take them back without recomputation; a new allocation evicts from the LRU head only
when no anonymous free block is left. Usage = referenced blocks / all blocks, the quantity vLLM
reports as ``kv_cache_usage_perc``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

#: Journal entry kinds (see :attr:`KVCache.journal`).
STORED, REMOVED, CLEARED = 0, 1, 2


@dataclass(slots=True)
class BlockTable:
    """The blocks one request holds: hashed prompt blocks (in order) plus anonymous ones."""

    hashed: list[int] = field(default_factory=list)
    anonymous: int = 0

    @property
    def num_blocks(self) -> int:
        """Total blocks held."""
        return len(self.hashed) + self.anonymous


class KVCache:
    """Block accounting for one server: allocation, prefix lookup, LRU eviction."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refs: dict[int, int] = {}  # hash -> number of requests referencing it
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced (oldest first)
        self._free_anonymous = num_blocks
        self.evictions = 0
        #: When a list, what the cache did, in order, for KV events: ``(STORED, i)`` = block
        #: ``i`` of the last :meth:`allocate` call entered the cache, ``(REMOVED, hash)`` =
        #: evicted, ``(CLEARED, 0)`` = :meth:`reset`. ``None`` (default): nothing is recorded.
        self.journal: list[tuple[int, int]] | None = None

    # -- queries -----------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks available for allocation (anonymous free + evictable cached)."""
        return self._free_anonymous + len(self._lru)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by requests, 0..1."""
        return (self.num_blocks - self.num_free) / self.num_blocks

    @property
    def num_cached(self) -> int:
        """Blocks that carry a prefix hash (referenced or evictable)."""
        return len(self._refs)

    def is_cached(self, block_hash: int) -> bool:
        """Whether a block with this hash is resident (referenced or in the LRU)."""
        return block_hash in self._refs

    def match_prefix(self, hashes: list[int]) -> int:
        """How many leading blocks of ``hashes`` are resident."""
        n = 0
        refs = self._refs
        for h in hashes:
            if h not in refs:
                break
            n += 1
        return n

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    # -- allocation ---------------------------------------------------------------------------
    def can_allocate(self, hashes: list[int], hit: int, total_blocks: int) -> bool:
        """Whether :meth:`allocate` with the same arguments would succeed."""
        # Hit blocks sitting in the LRU are counted as free but get taken by this request.
        lru = self._lru
        hit_in_lru = sum(1 for h in hashes[:hit] if h in lru)
        return total_blocks - hit <= self.num_free - hit_in_lru

    def allocate(self, hashes: list[int], hit: int, total_blocks: int) -> BlockTable:
        """Reference the ``hit`` cached prefix blocks and allocate the rest.

        ``hashes`` are the request's full prompt block hashes; the ones past ``hit`` are
        registered as freshly computed blocks. Call :meth:`can_allocate` first.
        """
        refs = self._refs
        lru = self._lru
        for h in hashes[:hit]:
            r = refs[h]
            if r == 0:
                del lru[h]
            refs[h] = r + 1
        table = BlockTable(hashed=list(hashes[: min(len(hashes), total_blocks)]))
        journal = self.journal
        for i, h in enumerate(table.hashed[hit:], start=hit):
            self._take_block()
            if h in refs:  # registered by a request admitted earlier in the same step
                r = refs[h]
                if r == 0:
                    del lru[h]
                refs[h] = r + 1
                self._free_anonymous += 1  # the block we took is not needed after all
            else:
                refs[h] = 1
                if journal is not None:
                    journal.append((STORED, i))
        extra = total_blocks - len(table.hashed)
        for _ in range(extra):
            self._take_block()
        table.anonymous = extra
        return table

    def append_block(self, table: BlockTable) -> bool:
        """Give a decoding request one more block; ``False`` when none is free."""
        if self.num_free == 0:
            return False
        self._take_block()
        table.anonymous += 1
        return True

    def free(self, table: BlockTable) -> None:
        """Release a request's blocks; its hashed blocks become evictable (tail first)."""
        self._free_anonymous += table.anonymous
        refs = self._refs
        lru = self._lru
        # Reverse order: the end of a prompt is the least likely to be shared, so it should be
        # evicted before the beginning (vLLM frees in the same order for the same reason).
        for h in reversed(table.hashed):
            r = refs[h] - 1
            refs[h] = r
            if r == 0:
                lru[h] = None
        table.hashed = []
        table.anonymous = 0

    def reset(self) -> None:
        """Drop everything (a restarted server has a cold cache)."""
        self._refs.clear()
        self._lru.clear()
        self._free_anonymous = self.num_blocks
        if self.journal is not None:
            self.journal.append((CLEARED, 0))

    def _take_block(self) -> None:
        if self._free_anonymous > 0:
            self._free_anonymous -= 1
            return
        h, _ = self._lru.popitem(last=False)
        del self._refs[h]
        self.evictions += 1
        if self.journal is not None:
            self.journal.append((REMOVED, h))
