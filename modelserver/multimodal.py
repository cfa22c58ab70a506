"""Multimodal items in chat content: what they are, their content hash and how many prompt
tokens they stand for - the EPP, the sidecar and the simulator read them the same way.

Counted as llm-d-router v0.10's tokenizer-free ``estimate`` backend does:

- an item is a chat content block of type ``image_url``, ``video_url``, ``input_audio`` or
  ``audio_url`` (string contents and other block types are text);
- its hash is xxHash64 of the block's content - the URL string (a ``data:`` URI whole, so
  two copies of the same base64 image hash alike) or, for audio, ``data + format`` - written
  in lowercase hex;
- an image stands for ``width x height / 1024`` placeholder tokens (at least 1); the size is
  read from the header of a base64 ``data:image/...`` URI (PNG, GIF, JPEG), else 640 x 360
  is assumed (225 tokens); a video for 10 s x 2 frames/s x 225 tokens; audio for one token
  per 4 bytes of ``data + format``.

Repeated references to one item inside a request are kept in :func:`mm_items` (each costs
its placeholders) and counted once by :func:`unique_items` (one encode, one cache entry).
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import xxhash

#: Request header set by the EPP: the encode endpoints (``ip:port[,ip:port...]``) the decode
#: pod's sidecar sends the request's multimodal items to (llm-d's name).
ENCODER_HEADER: Final = "x-encoder-hosts-ports"

#: Content block type -> modality (llm-d's labels).
MODALITIES: Final = {"image_url": "image", "video_url": "video", "input_audio": "audio",
                     "audio_url": "audio"}

DEFAULT_WIDTH, DEFAULT_HEIGHT = 640, 360
IMAGE_TOKEN_FACTOR: Final = 1024
VIDEO_FRAMES: Final = 10 * 2  # 10 s sampled at 2 frames/s
BYTES_PER_TOKEN: Final = 4
#: Base64 characters decoded to find an image's size (JPEG's size marker may follow EXIF).
_HEADER_B64: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class MMItem:
    """One multimodal item of a request."""

    modality: str
    #: xxHash64 of the content, lowercase hex (llm-d's feature hash).
    hash: str
    #: Placeholder tokens it stands for in the prompt.
    tokens: int
    #: The content block as the client sent it (forwarded to an encoder).
    block: Any = None


def mm_items(messages: Sequence[Any] | None) -> tuple[MMItem, ...]:
    """Every multimodal block of chat ``messages``, in order (empty for text-only chat)."""
    if not isinstance(messages, list | tuple):
        return ()
    out: list[MMItem] = []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            modality = MODALITIES.get(kind) if isinstance(kind, str) else None
            if modality is None:
                continue
            item = _item(kind, modality, block)  # type: ignore[arg-type]
            if item is not None:
                out.append(item)
    return tuple(out)


def unique_items(items: Iterable[MMItem]) -> tuple[MMItem, ...]:
    """Items with repeats dropped (first occurrence kept)."""
    seen: dict[str, MMItem] = {}
    for item in items:
        seen.setdefault(item.hash, item)
    return tuple(seen.values())


def placeholder_tokens(items: Iterable[MMItem]) -> int:
    """Prompt tokens the items stand for."""
    return sum(i.tokens for i in items)


def mm_prompt_tokens(messages: Sequence[Any] | None, items: Sequence[MMItem]) -> int:
    """Prompt tokens of a multimodal chat as llm-d's ``estimate`` backend counts them: the
    bytes of every role and text (one token per 4 bytes, aligned to a token before each
    item) plus each item's placeholder tokens. ``items`` are ``mm_items(messages)``."""
    size = 0
    next_item = iter(items)
    for msg in messages or ():
        if not isinstance(msg, dict):
            continue
        role = msg.get("role")
        if isinstance(role, str):
            size += len(role.encode())
        content = msg.get("content")
        if isinstance(content, str):
            size += len(content.encode())
            continue
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                size += len(block["text"].encode())
            elif block.get("type") in MODALITIES:
                item = next((i for i in next_item if i.block is block), None)
                if item is not None:
                    size = -(-size // BYTES_PER_TOKEN) * BYTES_PER_TOKEN
                    size += item.tokens * BYTES_PER_TOKEN
    return -(-size // BYTES_PER_TOKEN)


def content_hash(content: str) -> str:
    """llm-d's item hash: xxHash64 of the content, lowercase hex."""
    return format(xxhash.xxh64_intdigest(content.encode()), "x")


def _item(kind: str, modality: str, block: dict[str, Any]) -> MMItem | None:
    if modality == "audio" and kind == "input_audio":
        audio = block.get("input_audio")
        if not isinstance(audio, dict):
            return None
        data = f"{audio.get('data') or ''}{audio.get('format') or ''}"
        if not data:
            return None
        return MMItem(modality, content_hash(data), max(1, -(-len(data) // BYTES_PER_TOKEN)),
                      block)
    ref = block.get(kind)
    url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str) or not url:
        return None
    if modality == "image":
        tokens = image_tokens(url)
    elif modality == "video":
        tokens = VIDEO_FRAMES * (DEFAULT_WIDTH * DEFAULT_HEIGHT // IMAGE_TOKEN_FACTOR)
    else:
        tokens = max(1, -(-len(url) // BYTES_PER_TOKEN))
    return MMItem(modality, content_hash(url), tokens, block)


def image_tokens(url: str) -> int:
    """Placeholder tokens of an image URL: its size / 1024 when it is a base64 data URI
    whose header can be read, else the 640 x 360 default."""
    size = image_size(url)
    w, h = size if size is not None else (DEFAULT_WIDTH, DEFAULT_HEIGHT)
    return max(1, w * h // IMAGE_TOKEN_FACTOR)


def image_size(url: str) -> tuple[int, int] | None:
    """(width, height) from a ``data:image/...;base64,`` URI's image header, or None."""
    if not url.startswith("data:image/"):
        return None
    at = url.find("base64,")
    if at < 0:
        return None
    head = url[at + 7:at + 7 + _HEADER_B64]
    head = head[:len(head) - len(head) % 4]
    try:
        data = base64.b64decode(head, validate=False)
    except (binascii.Error, ValueError):
        return None
    return _png(data) or _gif(data) or _jpeg(data)


def _png(d: bytes) -> tuple[int, int] | None:
    if d[:8] == b"\x89PNG\r\n\x1a\n" and len(d) >= 24 and d[12:16] == b"IHDR":
        w, h = struct.unpack(">II", d[16:24])
        return (w, h) if w > 0 and h > 0 else None
    return None


def _gif(d: bytes) -> tuple[int, int] | None:
    if d[:6] in (b"GIF87a", b"GIF89a") and len(d) >= 10:
        w, h = struct.unpack("<HH", d[6:10])
        return (w, h) if w > 0 and h > 0 else None
    return None


def _jpeg(d: bytes) -> tuple[int, int] | None:
    if d[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 9 <= len(d):
        if d[i] != 0xFF:
            i += 1
            continue
        marker = d[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            i += 2 if marker != 0xFF else 1
            continue
        (length,) = struct.unpack(">H", d[i + 2:i + 4])
        # SOF0-SOF15 except DHT (C4), JPG (C8) and DAC (CC) carry the frame size.
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack(">HH", d[i + 5:i + 9])
            return (w, h) if w > 0 and h > 0 else None
        i += 2 + length
    return None
