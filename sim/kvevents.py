"""KV-cache events, published the way vLLM publishes them (``--kv-events-config``).

Three parts:

* :class:`KVEventsConfig` — vLLM's ``KVEventsConfig`` fields and defaults, parsed strictly
  from the same JSON the ``--kv-events-config`` flag takes;
* :class:`BlockHasher` — vLLM's prefix-cache block hash: ``hash_fn((parent, tuple(token_ids),
  extra_keys))`` chained from ``NONE_HASH = hash_fn(seed)``, for each of vLLM's
  ``--prefix-caching-hash-algo`` values; the published hash is its low 64 bits;
* :class:`KVEventPublisher` — a ZMQ PUB socket sending ``[topic, seq, msgpack batch]`` once
  per engine step that changed the cache, plus the ROUTER replay socket answering from a
  bounded buffer of past batches (``buffer_steps``).

The engine records what its cache did during a step into a :class:`KVEventRecorder`; at the end
of the step the recorder hands the batch to the publisher.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import pickle
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cbor2
import orjson
import xxhash
import zmq
import zmq.asyncio

from modelserver.kvevents import (
    END_SEQ,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    encode_batch,
    seq_to_bytes,
    zmq_context,
)

log = logging.getLogger("sim.kvevents")

HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
#: vLLM's NONE_HASH seed for cryptographic algorithms when PYTHONHASHSEED is unset.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_U64 = (1 << 64) - 1
#: ``kv_cache_spec_kind`` vLLM 0.32 puts on every ``BlockStored`` of a plain decoder's cache
#: (the simulator models one full-attention KV cache group, ``group_idx`` 0).
SPEC_KIND_FULL_ATTENTION = "full_attention"


@dataclass(slots=True)
class KVEventsConfig:
    """vLLM's ``KVEventsConfig`` (same field names and defaults)."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
        if self.publisher not in ("zmq", "null"):
            raise ValueError(f"kv-events-config: unknown publisher {self.publisher!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"kv-events-config: {name!r} must be a positive integer")

    @property
    def active(self) -> bool:
        """Whether events are published at all."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def from_json(cls, text: str | dict[str, Any]) -> KVEventsConfig:
        """Parse the flag's JSON (or a YAML mapping); unknown keys and bad types are errors."""
        try:
            data = orjson.loads(text) if isinstance(text, str) else text
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"kv-events-config: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError("kv-events-config: expected a JSON object")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"kv-events-config: unknown field(s) {', '.join(unknown)}")
        for key, value in data.items():
            want: tuple[type, ...] = {
                "enable_kv_cache_events": (bool,), "buffer_steps": (int,), "hwm": (int,),
                "max_queue_size": (int,),
            }.get(key, (str, type(None)) if key in ("publisher", "replay_endpoint") else (str,))
            if not isinstance(value, want):
                raise ValueError(f"kv-events-config: field {key!r} has the wrong type")
        return cls(**data)

    def for_server(self, index: int) -> KVEventsConfig:
        """This config for the ``index``-th server of a fleet.

        Like vLLM's data-parallel ranks, a fixed tcp port the server binds is offset by
        ``index`` so one process can publish for many servers (``*`` or 0 ports are left to
        the OS). An endpoint it connects to is kept: every server of the process publishes
        into the same collector (llm-d's ``zmqEndpoint``), as separate vLLM servers given
        the same EPP address do.
        """
        endpoint = self.endpoint
        if _is_bind(endpoint):
            endpoint = _offset_port(endpoint, index) or endpoint
        return dataclasses.replace(self, endpoint=endpoint,
                                   replay_endpoint=_offset_port(self.replay_endpoint, index))


def _offset_port(endpoint: str | None, index: int) -> str | None:
    if not endpoint or index == 0 or not endpoint.startswith("tcp://"):
        return endpoint
    base, _, port = endpoint.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return endpoint  # wildcard or OS-chosen port: nothing to offset
    return f"{base}:{int(port) + index}"


class BlockHasher:
    """vLLM's chained block hash over token ids for one ``--prefix-caching-hash-algo``.

    ``hash_fn((parent_hash, tuple(block_token_ids), extra_keys))`` where the first block's
    parent is ``NONE_HASH = hash_fn(seed)``; ``seed`` is ``PYTHONHASHSEED`` when set, else
    ``"vllm-none-hash"`` for the sha256 algorithms and random bytes for the xxhash ones (so,
    as in vLLM, xxhash block hashes only agree across processes with ``PYTHONHASHSEED``).
    ``extra_keys`` per block: ``("lora", name, path)`` for an adapter, then
    ``("cache_salt", salt)`` on the first block only; ``None`` when there is neither.
    """

    def __init__(self, algo: str = "sha256", seed: str | None = None) -> None:
        if algo not in HASH_ALGOS:
            raise ValueError(f"unknown prefix caching hash algorithm {algo!r}")
        self.algo = algo
        serialize: Callable[[Any], bytes] = (
            (lambda obj: cbor2.dumps(obj, canonical=True)) if algo.endswith("_cbor")
            else (lambda obj: pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        )
        digest: Callable[[bytes], bytes] = (
            (lambda b: hashlib.sha256(b).digest()) if algo.startswith("sha256")
            else xxhash.xxh3_128_digest
        )
        self._serialize = serialize
        self._digest = digest
        if seed is None:
            seed = os.environ.get("PYTHONHASHSEED")
        if seed is None:
            seed = DEFAULT_NONE_HASH_SEED if algo.startswith("sha256") else os.urandom(32).hex()
        self.none_hash = self.hash_fn(seed)

    def hash_fn(self, obj: Any) -> bytes:
        """vLLM's ``hash_fn`` for this algorithm (serialize, then digest)."""
        return self._digest(self._serialize(obj))

    def block_hashes(self, token_ids: list[int], block_size: int, *,
                     lora: tuple[str, str] | None = None, cache_salt: str = "") -> list[bytes]:
        """Hashes of every full block of ``token_ids``."""
        out: list[bytes] = []
        parent = self.none_hash
        lora_key = [("lora", lora[0], lora[1])] if lora else []
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            keys: list[tuple[str, ...]] = list(lora_key)
            if start == 0 and cache_salt:
                keys.append(("cache_salt", cache_salt))
            extra = tuple(keys) if keys else None
            parent = self.hash_fn((parent, tuple(token_ids[start : start + block_size]), extra))
            out.append(parent)
        return out


def external(block_hash: bytes) -> int:
    """The int vLLM publishes for a block hash: its low 64 bits (big-endian)."""
    return int.from_bytes(block_hash, "big") & _U64


class KVEventRecorder:
    """Collects one engine step's events and hands them to ``sink`` at :meth:`flush`."""

    def __init__(self, sink: Callable[[list[Event]], None] | None = None) -> None:
        self.sink = sink
        self.pending: list[Event] = []

    def stored(self, hashes: list[int], parent: int | None, token_ids: list[int],
               block_size: int, lora_name: str | None, lora_id: int | None,
               extra_keys: list[list[Any] | None] | None) -> None:
        """Blocks ``hashes`` (a chain after ``parent``) entered the cache.

        ``extra_keys`` has one entry per block, ``None`` for a block without any (vLLM sends
        ``[None, ...]`` then, not an absent field).
        """
        self.pending.append(BlockStored(
            block_hashes=list(hashes), parent_block_hash=parent, token_ids=token_ids,
            block_size=block_size, lora_id=lora_id, medium=MEDIUM_GPU, lora_name=lora_name,
            extra_keys=extra_keys, group_idx=0, kv_cache_spec_kind=SPEC_KIND_FULL_ATTENTION))

    def removed(self, block_hash: int) -> None:
        """One block was evicted (vLLM sends one event per evicted block)."""
        self.pending.append(BlockRemoved(block_hashes=[block_hash], medium=MEDIUM_GPU,
                                         group_idx=0))

    def cleared(self) -> None:
        """The prefix cache was reset."""
        self.pending.append(AllBlocksCleared())

    def flush(self) -> None:
        """End of an engine step: publish what it recorded, if anything."""
        if self.pending:
            events, self.pending = self.pending, []
            if self.sink is not None:
                self.sink(events)


def _bind(sock: zmq.Socket[Any], endpoint: str, patience: float = 2.0) -> None:
    """Bind ``endpoint``, waiting out a previous life's socket: ZMQ closes a socket in its
    I/O thread after ``close()`` returns, so a revived server binding the same concrete
    address can find it still held for a few milliseconds."""
    deadline = time.monotonic() + patience
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as e:
            if e.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _is_bind(endpoint: str) -> bool:
    # vLLM's rule: bind wildcard and ipc/inproc endpoints, connect to the rest.
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KVEventPublisher:
    """ZMQ PUB (+ optional ROUTER replay) for one simulated server, like vLLM's publisher.

    Sends happen on the event loop without blocking (a PUB socket drops at its high-water
    mark rather than wait); the replay socket is served by a task. ``endpoint`` and
    ``replay_endpoint`` hold the concrete bound addresses after :meth:`open` (a ``*`` port
    becomes the chosen one, so a revived server binds the same address again).
    """

    def __init__(self, cfg: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        self.cfg = cfg
        self.endpoint = cfg.endpoint
        self.replay_endpoint = cfg.replay_endpoint
        self.dp_rank = data_parallel_rank
        self._bind = _is_bind(cfg.endpoint)  # decided once: the concrete address has no "*"
        self._topic = cfg.topic.encode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._pub: zmq.Socket[bytes] | None = None
        self._apub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.published = 0
        self.dropped = 0

    def open(self, **names: str) -> None:
        """Create and bind/connect the sockets; the sequence starts again at 0.

        ``names`` (``port``, ``name``, ``host``, ``model``) replace ``{port}`` etc. in the
        topic, a simulator extension: llm-d expects topics like ``kv@<pod>@<model>``.
        """
        if names:
            topic = self.cfg.topic
            for key, value in names.items():
                topic = topic.replace("{" + key + "}", value)
            self._topic = topic.encode()
        ctx = zmq_context()
        self._seq = 0
        self._buffer.clear()
        apub = ctx.socket(zmq.PUB)
        apub.setsockopt(zmq.SNDHWM, self.cfg.hwm)
        apub.setsockopt(zmq.LINGER, 0)
        if self._bind:
            _bind(apub, self.endpoint)
            self.endpoint = apub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            apub.connect(self.endpoint)
        self._apub = apub
        self._pub = zmq.Socket.shadow(apub.underlying)
        if self.replay_endpoint is not None:
            router = ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            _bind(router, self.replay_endpoint)
            self.replay_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._replay = router
            self._task = asyncio.get_running_loop().create_task(self._serve_replay(),
                                                                name="kv-replay")

    async def close(self) -> None:
        """Close the sockets (a killed server stops publishing)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for sock in (self._replay, self._apub):
            if sock is not None:
                sock.close(linger=0)
        self._replay = self._apub = None
        self._pub = None

    def publish(self, events: list[Event]) -> None:
        """Send one batch; kept in the replay buffer even when the PUB socket dropped it."""
        pub = self._pub
        if pub is None:
            return
        seq = self._seq
        self._seq += 1
        payload = encode_batch(EventBatch(ts=time.time(), events=events,
                                          data_parallel_rank=self.dp_rank))
        self._buffer.append((seq, payload))
        try:
            pub.send_multipart((self._topic, seq_to_bytes(seq), payload), flags=zmq.NOBLOCK)
            self.published += 1
        except zmq.Again:
            self.dropped += 1

    async def _serve_replay(self) -> None:
        router = self._replay
        assert router is not None
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            if len(start) != 8:
                log.warning("invalid replay start of %d bytes", len(start))
                continue
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await router.send_multipart([client, b"", self._topic, seq_to_bytes(seq),
                                                 payload])
            await router.send_multipart([client, b"", b"", END_SEQ, b""])
