"""CPU time to rename ``model`` back in an SSE stream (the EPP's response path), per event.

    python -m bench.response_rewrite_bench [--events 20000] [--rounds 7]

Three streams of vLLM-shaped chat chunks (~330 B each, several events per Envoy chunk):
compact JSON as vLLM writes it, the same with spaces (``"model": "x"``), and a stream with
nothing to rename. Compared with the compact-only byte replace the rewriter used before it
understood any JSON spacing (``compact-only``, kept here as the baseline). CPU time
(``process_time``), best round, microseconds per event.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import orjson

from epp.requestcontrol.response import ResponseRewriter

TARGET, CLIENT = "food-review-v1", "food-review"
EVENTS_PER_CHUNK = 4


def event(i: int, *, spaced: bool, model: str = TARGET) -> bytes:
    body = {"id": "chatcmpl-6f1c", "object": "chat.completion.chunk", "created": 1767225600,
            "model": model, "choices": [{"index": 0, "delta": {"content": f" token{i}"},
                                         "logprobs": None, "finish_reason": None}]}
    text = orjson.dumps(body)
    if spaced:
        text = text.replace(b'":', b'": ').replace(b',"', b', "')
    return b"data: " + text + b"\n\n"


def chunks(n: int, **kw: object) -> list[bytes]:
    events = [event(i, **kw) for i in range(n)]  # type: ignore[arg-type]
    return [b"".join(events[i:i + EVENTS_PER_CHUNK]) for i in range(0, n, EVENTS_PER_CHUNK)]


class CompactOnly:
    """The previous rewriter's ``chunk()`` step for step: one compact pattern, a byte replace."""

    __slots__ = ("_carry", "_from", "_to", "client_model", "first_token_seen", "target_model")

    def __init__(self, client_model: str, target_model: str) -> None:
        self.client_model, self.target_model = client_model, target_model
        self.first_token_seen = False
        self._carry = b""
        self._from = b'"model":' + orjson.dumps(target_model)
        self._to = b'"model":' + orjson.dumps(client_model)

    @property
    def renames(self) -> bool:
        return self.client_model != self.target_model

    def chunk(self, chunk: bytes, end_of_stream: bool) -> bytes:
        data = self._carry + chunk if self._carry else chunk
        if end_of_stream:
            self._carry = b""
            complete = data
        else:
            cut = data.rfind(b"\n") + 1
            complete, self._carry = data[:cut], data[cut:]
        if not complete:
            return b""
        if not self.first_token_seen and b"data:" in complete:
            self.first_token_seen = True
        if b'"usage":{' in complete:
            pass  # no usage in these streams
        if self.renames and self._from in complete:
            complete = complete.replace(self._from, self._to)
        return complete


def compact_only(stream: list[bytes]) -> None:
    rw = CompactOnly(CLIENT, TARGET)
    for chunk in stream:
        rw.chunk(chunk, False)


def current(stream: list[bytes]) -> None:
    rw = ResponseRewriter(CLIENT, TARGET)
    for chunk in stream:
        rw.chunk(chunk, False)


def best_us_per_event(fn: Callable[[list[bytes]], None], stream: list[bytes], events: int,
                      rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        fn(stream)
        best = min(best, time.process_time() - start)
    return best / events * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    n = args.events
    streams = {
        "compact (vLLM)": chunks(n, spaced=False),
        "spaced": chunks(n, spaced=True),
        "nothing to rename": chunks(n, spaced=False, model="other-model"),
    }
    print(f"{'stream':<20} {'compact-only us/event':>22} {'current us/event':>17}")
    for name, stream in streams.items():
        base = best_us_per_event(compact_only, stream, n, args.rounds)
        now = best_us_per_event(current, stream, n, args.rounds)
        print(f"{name:<20} {base:>22.3f} {now:>17.3f}")


if __name__ == "__main__":
    main()
