"""The twin's baseline routers: what Envoy's cluster load balancers do, without Envoy.

- ``round-robin``: each request to the next server in turn;
- ``random``: uniformly at random (seeded);
- ``least-request``: Envoy's ``LEAST_REQUEST`` with equal weights - the power of two choices:
  two distinct servers at random, the one with fewer requests in flight wins (ties: the first).

They read no metrics; their only state is their own in-flight count, like Envoy's.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from bench.twin.loop import ServerState


class _Baseline:
    scrape_interval: float | None = None

    def __init__(self, name: str, keys: list[str], seed: int) -> None:
        self.name = name
        self.keys = keys
        self.rng = random.Random(f"{name}:{seed}")
        self.inflight = dict.fromkeys(keys, 0)
        self._where: dict[int, str] = {}
        self._next = 0

    def choose(self) -> str:
        raise NotImplementedError

    def route(self, index: int, path: str, body: bytes, now: float,
              headers: Mapping[str, str]) -> str:
        key = self.choose()
        self.inflight[key] += 1
        self._where[index] = key
        return key

    def done(self, index: int, prompt_tokens: int, completion_tokens: int,
             now: float) -> None:
        self.inflight[self._where.pop(index)] -= 1

    def begin_scrape(self, key: str) -> None:
        """Baselines read no metrics."""

    def scraped(self, key: str, state: ServerState) -> None:
        """Baselines read no metrics."""


class RoundRobin(_Baseline):
    def choose(self) -> str:
        key = self.keys[self._next % len(self.keys)]
        self._next += 1
        return key


class Random(_Baseline):
    def choose(self) -> str:
        return self.rng.choice(self.keys)


class LeastRequest(_Baseline):
    def choose(self) -> str:
        a, b = self.rng.sample(self.keys, 2) if len(self.keys) > 1 else (self.keys[0],) * 2
        return b if self.inflight[b] < self.inflight[a] else a
