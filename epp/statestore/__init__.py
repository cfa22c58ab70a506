"""Routing state shared by active-active EPP replicas (docs/active-active.md).

``open_store(url)`` turns a ``--state-store`` URL into a :class:`StateStore`: ``memory://``
keeps everything in this process; ``valkey://`` / ``valkeys://`` share it through Valkey.
"""

from __future__ import annotations

from epp.statestore.base import NO_INFLIGHT, InFlight, StateStore
from epp.statestore.memory import MemoryStateStore
from epp.statestore.url import StoreURL, StoreURLError, parse_store_url
from epp.statestore.valkey import ValkeyStateStore

__all__ = ["NO_INFLIGHT", "InFlight", "MemoryStateStore", "StateStore", "StoreURL",
           "StoreURLError", "ValkeyStateStore", "open_store", "parse_store_url"]


def open_store(url: str | StoreURL, *, pool: str = "default",
               replica: str | None = None, secret: bytes | None = None) -> StateStore:
    """The store a URL names (not started: call ``await store.start()``); ``secret`` signs
    what a Valkey store writes (:mod:`epp.statestore.codec`)."""
    parsed = parse_store_url(url) if isinstance(url, str) else url
    if parsed.kind == "memory":
        return MemoryStateStore()
    return ValkeyStateStore(parsed, pool=pool, replica=replica, secret=secret)
