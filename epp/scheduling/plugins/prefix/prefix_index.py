"""The approximate prefix index now lives with the state store that holds it
(:mod:`epp.statestore.prefix_index`); this name stays for existing imports."""

from __future__ import annotations

from epp.statestore.prefix_index import PrefixIndex

__all__ = ["PrefixIndex"]
