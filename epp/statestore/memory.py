"""The in-process state store: one replica's own state, shared with nobody.

It is the default (``memory://``), and it is also the local view inside the Valkey store,
which is why the remote in-flight counts and the source of a prefix write are kept apart here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from epp.statestore.base import NO_INFLIGHT, InFlight, RemoteListener, StateStore
from epp.statestore.prefix_index import PrefixIndex

#: Session entries kept at most; the least recently written go first.
MAX_SESSIONS = 100_000


class MemoryStateStore(StateStore):
    """All state in this process. ``clock`` (seconds, monotonic) drives the session TTL."""

    kind = "memory"

    def __init__(self, *, session_ttl: float = 600.0, max_sessions: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.session_ttl = session_ttl
        self.max_sessions = max_sessions
        self.clock = clock
        #: This replica's own counts: endpoint -> [requests, tokens].
        self.own: dict[str, list[int]] = {}
        #: Other replicas' counts summed per endpoint (always empty when nothing is shared).
        self.remote: Mapping[str, InFlight] = {}
        self._remote_listeners: list[RemoteListener] = []
        self.index = PrefixIndex()
        self._sessions: dict[str, tuple[str, float]] = {}

    # --- in-flight counters -------------------------------------------------------------
    def add_inflight(self, endpoint: str, requests: int, tokens: int = 0) -> None:
        counts = self.own.get(endpoint)
        if counts is None:
            counts = self.own[endpoint] = [0, 0]
        # Never below zero: a release for a request counted before a restart must not make
        # an endpoint look less loaded than idle.
        counts[0] = max(0, counts[0] + requests)
        counts[1] = max(0, counts[1] + tokens)
        if counts[0] == 0 and counts[1] == 0:
            del self.own[endpoint]

    def inflight(self, endpoint: str) -> InFlight:
        own = self.own.get(endpoint)
        other = self.remote.get(endpoint, NO_INFLIGHT)
        if own is None:
            return other
        return InFlight(own[0] + other.requests, own[1] + other.tokens)

    def set_remote(self, remote: Mapping[str, InFlight]) -> None:
        """Replace the other replicas' counts (a shared store's pull) and tell the listeners
        when they changed."""
        if remote == self.remote:
            return
        self.remote = remote
        for listener in self._remote_listeners:
            listener(remote)

    def on_remote_inflight(self, listener: RemoteListener) -> None:
        self._remote_listeners.append(listener)

    # --- approximate prefix index -------------------------------------------------------
    def prefix_add(self, endpoint: str, hashes: list[int], capacity: int) -> None:
        self.index.add(endpoint, hashes, capacity)

    def prefix_match(self, hashes: list[int]) -> dict[str, int]:
        return self.index.match(hashes)

    def prefix_retain(self, endpoints: frozenset[str]) -> None:
        self.index.retain(endpoints)

    @property
    def prefix_size(self) -> int:
        return self.index.size

    # --- sessions -----------------------------------------------------------------------
    def session_set(self, key: str, value: str) -> None:
        self.session_put(key, value, self.clock() + self.session_ttl)

    def session_put(self, key: str, value: str, expires_at: float) -> None:
        """Store with an explicit expiry (the Valkey store replays others' writes this way)."""
        sessions = self._sessions
        sessions.pop(key, None)
        sessions[key] = (value, expires_at)
        while len(sessions) > self.max_sessions:
            del sessions[next(iter(sessions))]

    def session_get(self, key: str) -> str | None:
        entry = self._sessions.get(key)
        if entry is None:
            return None
        if entry[1] <= self.clock():
            del self._sessions[key]
            return None
        return entry[0]
