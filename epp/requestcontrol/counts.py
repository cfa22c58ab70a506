"""Per-endpoint counts that request-control plugins keep (requests or tokens in some state)."""

from __future__ import annotations


def take(counts: dict[str, int], key: str, n: int = 1) -> None:
    """Subtract ``n`` from ``counts[key]``, dropping the key at zero (so an endpoint with
    nothing counted holds no entry)."""
    left = counts.get(key, 0) - n
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
