"""vLLM's KV-cache event wire format (what ``--kv-events-config`` publishes over ZMQ).

Checked against vLLM 0.32's ``vllm/distributed/kv_events.py`` (``msgspec`` structs):

* a PUB socket sends three frames per batch: ``[topic, seq, payload]``; ``seq`` is an 8-byte
  big-endian counter starting at 0 for each publisher (a restarted server starts again at 0);
* ``payload`` is msgpack of ``EventBatch`` encoded as an **array** ``[ts, events, dp_rank]``
  (``dp_rank`` nil when unset; older releases sent only ``[ts, events]``);
* each event is a msgpack **map** whose first key is ``"type"`` (the class name:
  ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``), then the fields in declaration order;
  fields that have a default and hold it are left out (``omit_defaults``);
* block hashes are ints, the low 64 bits of the engine's block hash
  (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default), or the raw hash bytes when that is
  switched off; :func:`hash_to_u64` maps both to one ``int``;
* the optional ROUTER replay socket takes ``[b"", start_seq]`` from a DEALER and answers one
  ``[b"", topic, seq, payload]`` per buffered batch with ``seq >= start_seq``, then the end
  marker ``[b"", b"", -1 (signed 8 bytes), b""]``. Releases before the topic frame was added
  answer ``[b"", seq, payload]``; :func:`parse_replay_reply` reads both.

The structs below are declared exactly like vLLM's, so encoding with them produces the bytes a
real vLLM publishes (the simulator relies on that) and decoding is typed and validated in C
(``msgspec``), which is what keeps the EPP's indexer above 20,000 block events/s on one core.
Unknown fields are ignored, so newer vLLM releases that add fields still decode.
"""

from __future__ import annotations

from typing import Any

import msgspec
import zmq.asyncio

#: Value of ``seq`` in the replay socket's end-of-replay message (-1 as signed 8 bytes).
END_SEQ = (-1).to_bytes(8, "big", signed=True)

#: ``medium`` of blocks held in GPU memory (vLLM's ``MEDIUM_GPU``).
MEDIUM_GPU = "GPU"

_U64 = (1 << 64) - 1


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the three event types; encoded as a map tagged ``"type": <class name>``."""


class BlockStored(KVCacheEvent):
    """Full blocks that entered the prefix cache: one chain of hashes, its parent, its tokens."""

    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks evicted from the prefix cache."""

    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was dropped (vLLM's ``reset_prefix_cache``)."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's events; encoded as the array ``[ts, events, data_parallel_rank]``."""

    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


class MalformedMessage(ValueError):
    """A frame or payload that does not follow the wire format; ``reason`` labels metrics."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EventBatch)

#: Payloads above this size are dropped unread (a real batch is a few KiB to a few hundred).
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
#: Block hashes in one event above this are treated as hostile (a step stores far fewer).
MAX_BLOCKS_PER_EVENT = 65_536


def encode_batch(batch: EventBatch) -> bytes:
    """msgpack bytes of ``batch``, byte-identical to what vLLM publishes."""
    return _encoder.encode(batch)


def decode_batch(payload: bytes, *, max_bytes: int = MAX_PAYLOAD_BYTES,
                 max_blocks: int = MAX_BLOCKS_PER_EVENT) -> EventBatch:
    """Decode and validate one payload; raises :class:`MalformedMessage`."""
    if len(payload) > max_bytes:
        raise MalformedMessage("too_large", f"payload of {len(payload)} bytes")
    try:
        batch = _decoder.decode(payload)
    except msgspec.DecodeError as exc:  # garbage, truncated, wrong shape or types
        raise MalformedMessage("bad_payload", str(exc)) from None
    for ev in batch.events:
        if isinstance(ev, BlockStored | BlockRemoved) and len(ev.block_hashes) > max_blocks:
            raise MalformedMessage("too_large", f"{len(ev.block_hashes)} block hashes in one event")
        if isinstance(ev, BlockStored) and (
            ev.block_size <= 0 or len(ev.token_ids) != ev.block_size * len(ev.block_hashes)
        ):
            raise MalformedMessage(
                "bad_payload",
                f"BlockStored with {len(ev.block_hashes)} blocks of {ev.block_size} tokens "
                f"carries {len(ev.token_ids)} token ids",
            )
    return batch


def seq_to_bytes(seq: int) -> bytes:
    """The 8-byte big-endian sequence frame."""
    return seq.to_bytes(8, "big")


def parse_message(frames: list[bytes]) -> tuple[bytes, int, bytes]:
    """``(topic, seq, payload)`` of one PUB message; raises :class:`MalformedMessage`."""
    if len(frames) != 3:
        raise MalformedMessage("bad_frames", f"expected 3 frames, got {len(frames)}")
    topic, seq, payload = frames
    if len(seq) != 8:
        raise MalformedMessage("bad_frames", f"sequence frame of {len(seq)} bytes")
    return topic, int.from_bytes(seq, "big"), payload


def parse_replay_reply(frames: list[bytes]) -> tuple[int, bytes] | None:
    """``(seq, payload)`` of one replay answer as a DEALER receives it; ``None`` at the end.

    Accepts ``[b"", topic, seq, payload]`` (vLLM 0.32) and ``[b"", seq, payload]`` (older).
    """
    if len(frames) == 4 and frames[0] == b"":
        seq, payload = frames[2], frames[3]
    elif len(frames) == 3 and frames[0] == b"":
        seq, payload = frames[1], frames[2]
    else:
        raise MalformedMessage("bad_frames", f"replay answer of {len(frames)} frames")
    if len(seq) != 8:
        raise MalformedMessage("bad_frames", f"replay sequence frame of {len(seq)} bytes")
    if seq == END_SEQ:
        return None
    return int.from_bytes(seq, "big"), payload


def replay_request(start_seq: int) -> list[bytes]:
    """Frames a DEALER sends to ask the replay socket for every batch from ``start_seq`` on."""
    return [b"", seq_to_bytes(start_seq)]


_ctx: zmq.asyncio.Context | None = None


def zmq_context() -> zmq.asyncio.Context:
    """The process's asyncio ZMQ context (one set of I/O threads for every socket)."""
    global _ctx
    if _ctx is None:
        _ctx = zmq.asyncio.Context()
    return _ctx


def hash_to_u64(value: int | bytes) -> int:
    """One block hash as an unsigned 64-bit int (bytes: their last 8, big-endian)."""
    if isinstance(value, int):
        return value & _U64
    return int.from_bytes(value[-8:], "big")
