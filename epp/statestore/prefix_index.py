"""The approximate prefix-cache index: which endpoint has probably cached which blocks.

Per endpoint an LRU of block hashes (capacity = that server's KV blocks); globally
hash -> endpoints holding it, so a lookup costs O(matched blocks), not O(endpoints).
"""

from __future__ import annotations


class PrefixIndex:
    """Block hashes per endpoint with LRU eviction, plus the reverse map used for lookups."""

    def __init__(self) -> None:
        # A plain dict is an LRU here: re-inserting moves a key to the end, and the first key
        # is the oldest. It is faster than OrderedDict for this access pattern.
        self._lru: dict[str, dict[int, None]] = {}
        self._owners: dict[int, set[str]] = {}
        self._size = 0

    @property
    def size(self) -> int:
        """Number of (block, endpoint) entries held."""
        return self._size

    def add(self, key: str, hashes: list[int], capacity: int) -> None:
        """Record that endpoint ``key`` now caches ``hashes`` (most recent last)."""
        lru = self._lru.get(key)
        if lru is None:
            lru = self._lru[key] = {}
        owners = self._owners
        for h in hashes:
            if h in lru:
                del lru[h]
                lru[h] = None
                continue
            lru[h] = None
            holders = owners.get(h)
            if holders is None:
                owners[h] = {key}
            else:
                holders.add(key)
            self._size += 1
        while len(lru) > capacity > 0:
            self._evict(key, lru)

    def _evict(self, key: str, lru: dict[int, None]) -> None:
        oldest = next(iter(lru))
        del lru[oldest]
        holders = self._owners.get(oldest)
        if holders is not None:
            holders.discard(key)
            if not holders:
                del self._owners[oldest]
        self._size -= 1

    def match(self, hashes: list[int]) -> dict[str, int]:
        """``{endpoint: number of leading blocks it holds}`` for endpoints matching >= 1."""
        matched: dict[str, int] = {}
        alive: set[str] | None = None
        owners = self._owners
        for i, h in enumerate(hashes, 1):
            holders = owners.get(h)
            if not holders:
                break
            alive = set(holders) if alive is None else alive & holders
            if not alive:
                break
            for k in alive:
                matched[k] = i
        return matched

    def retain(self, keys: frozenset[str]) -> None:
        """Forget endpoints not in ``keys``."""
        for key in [k for k in self._lru if k not in keys]:
            lru = self._lru.pop(key)
            for h in lru:
                holders = self._owners.get(h)
                if holders is not None:
                    holders.discard(key)
                    if not holders:
                        del self._owners[h]
            self._size -= len(lru)
