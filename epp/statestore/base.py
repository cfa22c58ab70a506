"""What EPP replicas share, as one interface with a local and a shared implementation.

The request path only calls the synchronous methods, and they never touch the network: a
pick reads a local view, and a write lands in that view at once. A shared store pushes the
writes out and pulls the other replicas' in the background (see :mod:`epp.statestore.valkey`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InFlight:
    """Requests and prompt tokens in flight on one endpoint."""

    requests: int = 0
    tokens: int = 0


NO_INFLIGHT = InFlight()

#: Called with the other replicas' in-flight counts per endpoint whenever a pull (or the loss
#: of the store) changes them; runs on the event loop, never on the request path.
RemoteListener = Callable[[Mapping[str, InFlight]], None]


class StateStore(abc.ABC):
    """Routing state shared by every EPP replica of a pool.

    Three kinds of state, each with its own consistency (docs/active-active.md):

    - **in-flight counters** per endpoint: each replica owns its own counts; a reader sees its
      own exactly and the others' as of their last sync. A replica that dies stops renewing its
      counts and they expire.
    - **approximate prefix index**: block hash -> endpoints holding it, bounded per endpoint
      by an LRU capacity; every replica's additions reach every other replica.
    - **sessions**: a small string map (session/affinity data) with a TTL.
    """

    #: Short name for logs and metrics labels ("memory", "valkey").
    kind: str = ""

    # --- in-flight counters -------------------------------------------------------------
    @abc.abstractmethod
    def add_inflight(self, endpoint: str, requests: int, tokens: int = 0) -> None:
        """Change this replica's in-flight counts for ``endpoint`` (negative to release)."""

    @abc.abstractmethod
    def inflight(self, endpoint: str) -> InFlight:
        """In-flight counts for ``endpoint`` summed over every live replica."""

    # --- approximate prefix index -------------------------------------------------------
    @abc.abstractmethod
    def prefix_add(self, endpoint: str, hashes: list[int], capacity: int) -> None:
        """Record that ``endpoint`` now caches ``hashes`` (most recent last), keeping at most
        ``capacity`` blocks for it (least recently used go first; 0 = unbounded)."""

    @abc.abstractmethod
    def prefix_match(self, hashes: list[int]) -> dict[str, int]:
        """``{endpoint: leading blocks of hashes it holds}`` for endpoints matching >= 1."""

    @abc.abstractmethod
    def prefix_retain(self, endpoints: frozenset[str]) -> None:
        """Forget the prefix blocks of every endpoint not in ``endpoints`` (left the pool)."""

    # --- sessions -----------------------------------------------------------------------
    @abc.abstractmethod
    def session_set(self, key: str, value: str) -> None:
        """Remember ``value`` under ``key`` for the store's session TTL."""

    @abc.abstractmethod
    def session_get(self, key: str) -> str | None:
        """The value under ``key``, or None when unknown or expired."""

    @property
    def prefix_size(self) -> int:
        """Blocks in this replica's view of the prefix index (a gauge, not per request)."""
        return 0

    def on_remote_inflight(self, listener: RemoteListener) -> None:  # noqa: B027 - optional
        """Call ``listener`` with the other replicas' in-flight counts each time they change
        (a local store never calls it: nothing else is in flight)."""

    # --- life cycle ---------------------------------------------------------------------
    @property
    def shared(self) -> bool:
        """True while this replica's view includes the other replicas' state."""
        return False

    async def start(self) -> None:  # noqa: B027 - optional hook, nothing to start locally
        """Connect and begin syncing in the background (no-op for a local store)."""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to close locally
        """Stop syncing and release connections."""

    async def sync(self) -> None:  # noqa: B027 - optional hook, nothing to sync locally
        """Push pending writes and pull the others' state once, now (tests, shutdown)."""
