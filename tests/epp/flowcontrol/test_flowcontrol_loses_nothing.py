"""Whatever happens — bursts, full queues, displacement, TTLs, clients leaving, a flapping
saturation signal, shutdown — every request gets exactly one outcome and nothing stays
behind (queues, bytes, flows, gauge series)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from epp.flowcontrol import (
    FlowControlConfig,
    FlowController,
    FlowControlMetrics,
    FlowControlRequest,
    Outcome,
    PriorityBandConfig,
)

N = 300
CANCELLED = "cancelled"


def random_config(rng: random.Random) -> FlowControlConfig:
    orderings = ["fcfs-ordering-policy", "edf-ordering-policy", "slo-deadline-ordering-policy"]
    fairness = ["global-strict-fairness-policy", "round-robin-fairness-policy"]
    bands = tuple(
        PriorityBandConfig(priority=p, max_requests=rng.choice([0, 5, 20]),
                           max_bytes=rng.choice([0, 2_000]),
                           ordering_policy_ref=rng.choice(orderings),
                           fairness_policy_ref=rng.choice(fairness))
        for p in (10, 0))
    return FlowControlConfig(max_requests=rng.choice([0, 15, 40]),
                             max_bytes=rng.choice([0, 3_000]),
                             default_request_ttl=rng.choice([0.0, 0.02]),
                             priority_bands=bands)


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in registry.collect():
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.mark.parametrize("seed", range(6))
async def test_every_request_gets_exactly_one_outcome(seed: int) -> None:
    rng = random.Random(seed)
    registry = CollectorRegistry()
    state = {"p_saturated": 0.8}

    def saturation() -> float:
        return 1.0 if rng.random() < state["p_saturated"] else 0.0

    fc = FlowController(random_config(rng), saturation, pool_name="p",
                        metrics=FlowControlMetrics(registry), poll_interval=0.001)
    seen: dict[str, list[object]] = {}

    async def client(i: int) -> None:
        rid = f"r{i}"
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)
        r = FlowControlRequest(
            request_id=rid, fairness_id=rng.choice(["a", "b", "c", f"x{i}"]),
            priority=rng.choice([10, 0, -1, -7]), byte_size=rng.randrange(1, 400),
            ttl=rng.choice([None, 0.005, 0.05]),
            headers={"x-slo-ttft-ms": str(rng.randrange(1, 100))} if rng.random() < 0.5
            else {})
        seen[rid] = []  # from here on it is flow control's
        try:
            seen[rid].append(await fc.enqueue_and_wait(r))
        except asyncio.CancelledError:
            seen[rid].append(CANCELLED)
            raise

    tasks = [asyncio.create_task(client(i)) for i in range(N)]
    shutdown = seed % 3 == 2
    for step in range(60):
        await asyncio.sleep(0.001 if step % 10 == 0 else 0)
        for t in rng.sample(tasks, 3):
            t.cancel()  # clients going away at random moments
    if shutdown:
        await fc.aclose()
    else:
        state["p_saturated"] = 0.0  # let the rest through
        fc.notify()
    await asyncio.gather(*tasks, return_exceptions=True)
    if not shutdown:
        await fc.aclose()

    # Each client that reached flow control saw exactly one result.
    assert len(seen) > N // 2
    assert all(len(v) == 1 for v in seen.values())
    # Nothing stays behind.
    assert fc.length == 0 and fc.nbytes == 0
    assert all(b["queued"] == 0 and b["bytes"] == 0 and b["flows"] == {}
               for b in fc.snapshot()["bands"])
    assert samples(registry, "inference_extension_flow_control_queue_size") == {}
    assert samples(registry, "inference_extension_flow_control_queue_bytes") == {}
    # The metrics recorded exactly one outcome per request, and agree with what clients saw.
    counts = Counter[str]()
    for labels, v in samples(
            registry,
            "inference_extension_flow_control_request_queue_duration_seconds_count").items():
        counts[dict(labels)["outcome"]] += int(v)
    assert sum(counts.values()) == len(seen)
    client_counts = Counter(o.value for [o] in seen.values() if isinstance(o, Outcome))
    for outcome, n in client_counts.items():
        assert counts[outcome] >= n
    cancelled = sum(1 for [o] in seen.values() if o == CANCELLED)
    # A client cancelled after its release keeps "Dispatched"; otherwise it counts as cancelled.
    assert counts[Outcome.EVICTED_CONTEXT_CANCELLED.value] <= cancelled
    if shutdown:
        assert Outcome.DISPATCHED.value in counts or Outcome.EVICTED_OTHER.value in counts
