"""Reading Envoy header maps into plain dicts."""

from __future__ import annotations

from typing import Any


def header_dict(header_map: Any) -> dict[str, str]:
    """Envoy ``HeaderMap`` → ``{lowercase name: value}``.

    Envoy sends ``raw_value`` (bytes) and leaves ``value`` empty; older builds did the reverse.
    A repeated header keeps its values joined with ``,`` as HTTP allows.
    """
    out: dict[str, str] = {}
    for h in header_map.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        key = h.key.lower()
        if key in out:
            out[key] = f"{out[key]},{value}"
        else:
            out[key] = value
    return out
