"""Policies and queues on their own: fairness choices, ordering keys, tombstones."""

from __future__ import annotations

import asyncio
import math

from epp.flowcontrol import FlowControlRequest, PriorityBandConfig
from epp.flowcontrol.policies import (
    BandThreshold,
    EDFOrdering,
    FCFSOrdering,
    GlobalStrictFairness,
    LeastInflightFairness,
    PriorityUsageLimit,
    PriorityUsageLimitParameters,
    RoundRobinFairness,
    SLODeadlineOrdering,
    StaticUsageLimit,
)
from epp.flowcontrol.queues import Band
from epp.flowcontrol.types import QueueItem

_seq = iter(range(10**9))


async def item(tenant: str, at: float, *, deadline: float | None = None,
               headers: dict[str, str] | None = None) -> QueueItem:
    fut = asyncio.get_running_loop().create_future()
    return QueueItem(FlowControlRequest(request_id=f"{tenant}@{at}", fairness_id=tenant,
                                        headers=headers or {}),
                     enqueued_at=at, deadline=deadline, seq=next(_seq), future=fut)


def band(fairness: object = None, ordering: object = None) -> Band:
    return Band(PriorityBandConfig(), ordering or FCFSOrdering(),  # type: ignore[arg-type]
                fairness or GlobalStrictFairness())  # type: ignore[arg-type]


async def test_round_robin_resumes_after_the_last_served_even_if_it_left() -> None:
    b = band(RoundRobinFairness())
    for t in ("a", "b", "c"):
        b.flow(t).push(await item(t, 1.0))
    first = b.fairness.pick(b)
    assert first is not None and first.fairness_id == "a"
    head = first.head()
    assert head is not None
    first.remove(head)
    b.drop_if_empty(first)  # "a" is gone; the turn passes to "b", not back to the start
    nxt = b.fairness.pick(b)
    assert nxt is not None and nxt.fairness_id == "b"


async def test_round_robin_wraps_around() -> None:
    b = band(RoundRobinFairness())
    for t in ("a", "b"):
        b.flow(t).push(await item(t, 1.0))
    picks = []
    for _ in range(4):
        q = b.fairness.pick(b)
        assert q is not None
        picks.append(q.fairness_id)
    assert picks == ["a", "b", "a", "b"]


async def test_least_inflight_picks_the_waiting_flow_holding_the_fewest_slots() -> None:
    b = band(LeastInflightFairness())
    for t in ("a", "b", "c"):
        b.flow(t).push(await item(t, 1.0))
    for _ in range(5):
        b.started("a")
    b.started("b")
    b.started("d")  # in flight but nothing waiting: not a candidate
    picked = b.fairness.pick(b)
    assert picked is not None and picked.fairness_id == "c"  # 0 in flight beats b's 1
    b.started("c")
    b.started("c")
    picked = b.fairness.pick(b)
    assert picked is not None and picked.fairness_id == "b"  # b 1, c 2, a 5


async def test_least_inflight_takes_equals_in_turn() -> None:
    b = band(LeastInflightFairness())
    for t in ("a", "b", "c"):
        for k in range(2):
            b.flow(t).push(await item(t, float(k)))
    picks = []
    for _ in range(6):
        q = b.fairness.pick(b)
        assert q is not None
        picks.append(q.fairness_id)
    assert picks == ["a", "b", "c", "a", "b", "c"]


async def test_empty_band_picks_nothing() -> None:
    for policy in (GlobalStrictFairness(), RoundRobinFairness(), LeastInflightFairness()):
        assert policy.pick(band(policy)) is None


async def test_global_strict_picks_the_flow_with_the_oldest_head() -> None:
    b = band()
    b.flow("young").push(await item("young", 5.0))
    b.flow("old").push(await item("old", 2.0))
    picked = b.fairness.pick(b)
    assert picked is not None and picked.fairness_id == "old"


async def test_ordering_keys() -> None:
    fcfs = FCFSOrdering()
    edf = EDFOrdering()
    slo = SLODeadlineOrdering()
    assert fcfs.key(await item("a", 3.0)) < fcfs.key(await item("a", 4.0))
    assert edf.key(await item("a", 9.0, deadline=10.0)) < edf.key(await item("a", 1.0,
                                                                             deadline=20.0))
    assert edf.key(await item("a", 1.0))[0] == math.inf
    assert slo.key(await item("a", 1.0, headers={"x-slo-ttft-ms": "250"}))[0] == 1.25
    for bad in ("", "-5", "1.5", "soon"):
        assert slo.key(await item("a", 1.0, headers={"x-slo-ttft-ms": bad}))[0] == math.inf


async def test_queue_head_and_tail_skip_removed_items() -> None:
    b = band()
    q = b.flow("t")
    items = [await item("t", float(i)) for i in range(5)]
    for it in items:
        q.push(it)
    q.remove(items[0])
    q.remove(items[4])
    assert q.head() is items[1] and q.tail() is items[3]
    assert (q.length, b.length) == (3, 3)


def test_static_usage_limit_gives_every_band_the_threshold() -> None:
    assert list(StaticUsageLimit(0.9).ceilings(0.5, [3, 2, 1])) == [0.9, 0.9, 0.9]


def test_priority_usage_limit_gives_listed_bands_their_own_ceiling() -> None:
    limit = PriorityUsageLimit("", PriorityUsageLimitParameters(
        threshold=0.9, bands=(BandThreshold(-1, 0.5), BandThreshold(2, 0.8))))
    assert list(limit.ceilings(0.3, [3, 2, 0, -1])) == [0.9, 0.8, 0.9, 0.5]
