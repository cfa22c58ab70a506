"""Seeded workloads for the routing comparison (``python -m bench.compare``).

Each workload turns (offered rate, duration, seed) into a schedule of streaming completion
requests (:class:`RequestSpec`: arrival offset + body). Same seed -> byte-identical
schedule, so every contender gets exactly the same requests at the same times.

Prompt text is made of 4-byte words because the simulator counts 1 token per 4 UTF-8 bytes
(``sim/tokenizer.py``), so "N tokens" below is exactly what the simulator prefills.

The sizes and the nominal capacities are fixed here, before any comparison (see
``docs/benchmarks.md`` for how they were scaled from the llm-d workload).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# The fleet every contender shares (bench.compare starts it; see docs/benchmarks.md).
FLEET_SIZE = 4
PROFILE = "8b-h100"
LORA_ADAPTERS = tuple(f"adapter-{i:02d}" for i in range(12))   # 12 adapters > 4 slots/server

# 8b-h100 timing (sim/profiles.py), used only to state nominal capacities.
_ITL, _OVERHEAD, _PER_TOKEN = 0.012, 0.030, 0.00025


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a schedule: send ``body`` to ``path`` at ``at`` seconds (wall)."""

    at: float
    path: str
    body: dict[str, Any]
    tag: str = ""   # prefix group / adapter, for per-class analysis
    #: Extra request headers (e.g. a tenant's fairness id, an objective).
    headers: dict[str, str] = field(default_factory=dict)


def _words(rng: random.Random, tokens: int) -> str:
    # 3 letters + space = 4 bytes = one simulator token; random so prompts never share
    # a prefix by accident.
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(rng.choice(letters) + rng.choice(letters) + rng.choice(letters) + " "
                   for _ in range(tokens))


def _completion(prompt: str, max_tokens: int, model: str = MODEL) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}


def poisson_arrivals(rng: random.Random, rate: float, n: int) -> list[float]:
    """``n`` arrival times of a Poisson process of ``rate`` per second, from 0."""
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def constant_arrivals(rate: float, n: int) -> list[float]:
    """``n`` arrivals exactly ``1 / rate`` apart."""
    return [i / rate for i in range(n)]


def burst_arrivals(rng: random.Random, rate: float, n: int, *, period: float = 6.0,
                   width: float = 0.5) -> list[float]:
    """Average ``rate``, delivered as one burst every ``period`` s: each burst's
    ``rate x period`` requests arrive uniformly within ``width`` s (a 12x peak by default)."""
    per_burst = max(1, round(rate * period))
    out: list[float] = []
    start = 0.0
    while len(out) < n:
        out.extend(sorted(start + rng.uniform(0, width) for _ in range(per_burst)))
        start += period
    return out[:n]


@dataclass(frozen=True, slots=True)
class Workload:
    """A named request mix with the offered rates the comparison runs it at.

    ``capacity`` is the fleet's nominal req/s for this mix (see each builder); ``loads``
    are the fractions of it that the full run offers, each for ``duration`` model seconds.
    """

    name: str
    title: str
    description: str
    capacity: float
    loads: tuple[float, ...]
    duration: float
    build: Callable[[random.Random, float, float], list[RequestSpec]]

    def schedule(self, load: float, duration: float, seed: int = 0) -> list[RequestSpec]:
        """The schedule at ``load`` x capacity over about ``duration`` seconds."""
        return self.build(random.Random(f"{self.name}:{seed}"), load * self.capacity, duration)


# -- (a) shared prefix, shaped like llm-d's workload ------------------------------------------
SP_SYSTEM, SP_QUESTION, SP_OUTPUT, SP_PER_GROUP = 6000, 1200, 100, 5


def _prefill(tokens: float) -> float:
    return _OVERHEAD + _ITL + tokens * _PER_TOKEN


# Ideal routing prefills the system prompt once per group: mean uncached = Q + S / 5.
SP_CAPACITY = FLEET_SIZE / _prefill(SP_QUESTION + SP_SYSTEM / SP_PER_GROUP)


def shared_prefix(rng: random.Random, rate: float, duration: float) -> list[RequestSpec]:
    """Groups of 5 prompts: a 6,000-token group system prompt + a unique 1,200-token
    question, 100 output tokens; the 5 prompts of each group are shuffled over the run,
    Poisson arrivals. As many groups as the run has room for (n / 5)."""
    n = max(SP_PER_GROUP, round(rate * duration))
    groups = math.ceil(n / SP_PER_GROUP)
    systems = [_words(rng, SP_SYSTEM) for _ in range(groups)]
    order = [g for g in range(groups) for _ in range(SP_PER_GROUP)]
    rng.shuffle(order)
    times = poisson_arrivals(rng, rate, n)
    return [RequestSpec(t, "/v1/completions",
                        _completion(systems[g] + _words(rng, SP_QUESTION), SP_OUTPUT),
                        tag=f"group-{g}")
            for t, g in zip(times, order[:n], strict=True)]


# -- (b) LoRA mix --------------------------------------------------------------------------------
LORA_PROMPT, LORA_OUTPUT = 2000, 100
LORA_CAPACITY = FLEET_SIZE / _prefill(LORA_PROMPT)


def lora_mix(rng: random.Random, rate: float, duration: float) -> list[RequestSpec]:
    """12 adapters (Zipf 1.0 popularity: the top adapter gets ~32%), 4 LoRA slots per
    server; unique 2,000-token prompts, 100 output tokens, Poisson arrivals."""
    n = max(1, round(rate * duration))
    weights = [1 / (i + 1) for i in range(len(LORA_ADAPTERS))]
    times = poisson_arrivals(rng, rate, n)
    specs = []
    for t in times:
        adapter = rng.choices(LORA_ADAPTERS, weights)[0]
        specs.append(RequestSpec(t, "/v1/completions",
                                 _completion(_words(rng, LORA_PROMPT), LORA_OUTPUT, adapter),
                                 tag=adapter))
    return specs


# -- (c) ShareGPT-like lengths, (d) bursts -------------------------------------------------------
# Lognormal lengths with ShareGPT-like shape (long right tail), no prefix sharing. Medians
# are ~2x ShareGPT's input and ~0.5x its output so 2 CPUs can drive the fleet (fewer SSE
# events per unit of GPU work); see docs/benchmarks.md.
SG_IN_MEDIAN, SG_IN_SIGMA, SG_OUT_MEDIAN, SG_OUT_SIGMA = 800, 0.7, 80, 0.6
_SG_IN_MEAN = SG_IN_MEDIAN * math.exp(SG_IN_SIGMA ** 2 / 2)
SG_CAPACITY = FLEET_SIZE / _prefill(_SG_IN_MEAN)


def _sharegpt_lengths(rng: random.Random) -> tuple[int, int]:
    prompt = int(min(4000, max(16, rng.lognormvariate(math.log(SG_IN_MEDIAN), SG_IN_SIGMA))))
    out = int(min(400, max(4, rng.lognormvariate(math.log(SG_OUT_MEDIAN), SG_OUT_SIGMA))))
    return prompt, out


def sharegpt_like(rng: random.Random, rate: float, duration: float) -> list[RequestSpec]:
    """Unique prompts, lognormal input (median 800 tokens, sigma 0.7, clipped 16..4000) and
    output (median 80, sigma 0.6, clipped 4..400) lengths, Poisson arrivals."""
    n = max(1, round(rate * duration))
    times = poisson_arrivals(rng, rate, n)
    specs = []
    for t in times:
        prompt, out = _sharegpt_lengths(rng)
        specs.append(RequestSpec(t, "/v1/completions", _completion(_words(rng, prompt), out)))
    return specs


def bursts(rng: random.Random, rate: float, duration: float) -> list[RequestSpec]:
    """The ShareGPT-like mix, arriving in bursts: every 6 s, 6 s worth of requests within
    0.5 s (12x the average rate at the peak)."""
    n = max(1, round(rate * duration))
    times = burst_arrivals(rng, rate, n)
    specs = []
    for t in times:
        prompt, out = _sharegpt_lengths(rng)
        specs.append(RequestSpec(t, "/v1/completions", _completion(_words(rng, prompt), out)))
    return specs


WORKLOADS: dict[str, Workload] = {
    w.name: w for w in (
        Workload("shared-prefix", "Shared prefix (llm-d shape, scaled)",
                 shared_prefix.__doc__ or "", SP_CAPACITY, (0.25, 0.5, 0.75), 30.0, shared_prefix),
        Workload("lora", "LoRA mix (12 adapters, 4 slots per server)",
                 lora_mix.__doc__ or "", LORA_CAPACITY, (0.75,), 20.0, lora_mix),
        Workload("sharegpt", "ShareGPT-like lengths, no prefix sharing",
                 sharegpt_like.__doc__ or "", SG_CAPACITY, (0.75,), 20.0, sharegpt_like),
        Workload("bursts", "Bursts of the ShareGPT-like mix",
                 bursts.__doc__ or "", SG_CAPACITY, (0.75,), 20.0, bursts),
    )
}


def write_specs(specs: list[RequestSpec], path: Path) -> None:
    """Write a schedule as JSONL for :mod:`bench.openloop`."""
    path.write_bytes(b"".join(orjson.dumps(
        {"at": s.at, "path": s.path, "body": s.body, "tag": s.tag, "headers": s.headers})
        + b"\n" for s in specs))


def iter_tags(specs: list[RequestSpec]) -> Iterator[str]:
    """The tag of every request, in order (for per-class breakdowns)."""
    return (s.tag for s in specs)
