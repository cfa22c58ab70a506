"""A cheap, deterministic stand-in for a real tokenizer.

One token = 4 bytes of UTF-8 text, counted from the start of the prompt. That matches the
"16 tokens ~ 64 characters" assumption of the approximate prefix-cache scorer, makes the token
count of a prompt stable, and guarantees that two prompts sharing a text prefix share the
corresponding token (and KV block) prefix. Block hashes are computed straight from the bytes, so
no token-id list is ever materialised.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

import xxhash

from modelserver.multimodal import MODALITIES, mm_items

BYTES_PER_TOKEN = 4

#: Output vocabulary: every entry is exactly one token long (4 bytes), so a generated text of n
#: tokens re-tokenizes to n tokens when a client sends it back in a later turn.
VOCAB: tuple[str, ...] = (
    " the", " sim", " gpu", " kv ", " and", " for", " llm", " req", " out", " yes",
    " new", " old", " big", " low", " run", " hit", " map", " key", " set", " get",
    " top", " end", " one", " two", " six", " ten", " day", " way", " use", " fit",
)


def count_tokens(data: bytes) -> int:
    """Number of tokens in ``data`` (UTF-8 bytes)."""
    return -(-len(data) // BYTES_PER_TOKEN)


def block_hashes(data: bytes, block_size: int, salt: str) -> list[int]:
    """Chained hashes of the *full* token blocks of ``data``.

    Hash ``i`` covers blocks ``0..i`` (each seeded with the previous one), as in vLLM's prefix
    cache, so equal hashes mean equal prefixes. ``salt`` (model or adapter name, plus any
    ``cache_salt``) keeps different models' blocks apart.
    """
    step = block_size * BYTES_PER_TOKEN
    h = xxhash.xxh64_intdigest(salt.encode())
    out = []
    for start in range(0, len(data) - step + 1, step):
        h = xxhash.xxh64_intdigest(data[start : start + step], seed=h)
        out.append(h)
    return out


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") in MODALITIES:
                parts.extend(_placeholders(part))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise ValueError("message content must be a string or a list of content parts")


def _placeholders(block: dict[str, Any]) -> list[str]:
    """A multimodal block as its placeholder tokens: 4 characters derived from the item's
    hash, once per token it stands for (:mod:`modelserver.multimodal`), so prompts with the same
    image share blocks and an image costs its tokens of prefill."""
    items = mm_items([{"content": [block]}])
    return [f"{item.hash[-4:]:0>4}" * item.tokens for item in items]


def apply_chat_template(messages: list[Any]) -> str:
    """Render chat messages the way a Llama-3 style template would (generation prompt added)."""
    out = ["<|begin_of_text|>"]
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError("each message must be an object with a string 'role'")
        out.append(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n")
        out.append(_content_text(m.get("content")))
        out.append("<|eot_id|>")
    out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


def output_token(seed: int, index: int) -> str:
    """Text of the ``index``-th generated token of a request whose text seed is ``seed``."""
    return VOCAB[(seed + index * 7) % len(VOCAB)]


def token_ids(data: bytes) -> list[int]:
    """Token ids of ``data``: each 4-byte chunk read as a little-endian uint32.

    Lossless and deterministic, so equal text prefixes give equal id prefixes and a prompt's
    ids can be recomputed by anyone (the EPP's tests, a token producer) without a vocabulary
    file. Ids are < 2**32, like every real vocabulary's; the last chunk is zero-padded.
    """
    pad = -len(data) % BYTES_PER_TOKEN
    if pad:
        data = data + b"\0" * pad
    ids = array("I")
    ids.frombytes(data)
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tolist()
