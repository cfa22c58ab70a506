"""In-flight eviction (``enableEviction``): which requests may go, in which order, and how
many per decision (upstream v0.10's pacing)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from epp.flowcontrol import FlowControlConfig, FlowControlRequest, Outcome
from epp.flowcontrol.eviction import (
    EvictionMetrics,
    InFlightRequest,
    PriorityThenTimeEvictionOrder,
    Reclamation,
    RequestEvicted,
    RequestEvictor,
    SheddableEvictionFilter,
)
from tests.support.flowcontrol import MakeFC

Ended = list[str]


def evictor() -> RequestEvictor:
    return RequestEvictor(SheddableEvictionFilter(), PriorityThenTimeEvictionOrder())


def victim(ended: Ended, rid: str, priority: int, at: float) -> InFlightRequest:
    def evict(err: RequestEvicted) -> None:
        assert err.status == 429
        ended.append(rid)
    return InFlightRequest(rid, priority, at, evict)


def reclamation(ev: RequestEvictor, grace: float = 0.5) -> Reclamation:
    return Reclamation(ev, grace=grace, metrics=EvictionMetrics(CollectorRegistry()))


def test_only_sheddable_requests_may_be_evicted() -> None:
    f = SheddableEvictionFilter()
    assert [f.evictable(p) for p in (-5, -1, 0, 3)] == [True, True, False, False]


def test_lowest_priority_then_newest_dispatch_goes_first() -> None:
    ended: Ended = []
    ev = evictor()
    for rid, prio, at in (("old-1", -1, 1.0), ("new-1", -1, 5.0), ("old-2", -2, 2.0),
                          ("new-2", -2, 3.0)):
        ev.track(victim(ended, rid, prio, at))
    assert ev.evict_n(4, priority_bound=0) == ["new-2", "old-2", "new-1", "old-1"]
    assert ended == ["new-2", "old-2", "new-1", "old-1"]


def test_eviction_stops_at_the_waiting_bands_priority() -> None:
    ended: Ended = []
    ev = evictor()
    ev.track(victim(ended, "a", -3, 1.0))
    ev.track(victim(ended, "b", -1, 1.0))
    assert ev.evict_n(2, priority_bound=-2) == ["a"]  # b is not below -2


def test_a_decision_evicts_at_most_two_then_waits_for_confirmation_and_grace() -> None:
    ended: Ended = []
    ev = evictor()
    for i in range(5):
        ev.track(victim(ended, f"r{i}", -1, float(i)))
    ev.inflight_total = 5
    rec = reclamation(ev, grace=0.5)
    # saturation 2.0 over ceiling 1.0 with 5 in flight (credit 0.4): 3 wanted, 2 at most
    assert rec.maybe_reclaim(10.0, 2.0, [(0, 1.0)]) == ["r4", "r3"]
    assert rec.maybe_reclaim(10.1, 2.0, [(0, 1.0)]) == []  # outstanding
    rec.confirm("r4", 10.2)
    rec.confirm("r3", 10.2)
    assert rec.maybe_reclaim(10.5, 2.0, [(0, 1.0)]) == []  # cooling until 10.7
    assert rec.maybe_reclaim(10.8, 2.0, [(0, 1.0)]) == ["r2", "r1"]


def test_an_unconfirmed_eviction_stops_blocking_after_the_timeout() -> None:
    ended: Ended = []
    ev = evictor()
    ev.track(victim(ended, "a", -1, 0.0))
    ev.track(victim(ended, "b", -1, 1.0))
    ev.inflight_total = 2
    rec = reclamation(ev)
    assert rec.maybe_reclaim(0.0, 1.0, [(0, 1.0)]) == ["b"]
    assert rec.maybe_reclaim(5.0, 1.0, [(0, 1.0)]) == []
    assert rec.maybe_reclaim(10.5, 1.0, [(0, 1.0)]) == ["a"]


def test_nothing_is_evicted_for_a_band_not_above_the_victims() -> None:
    ended: Ended = []
    ev = evictor()
    ev.track(victim(ended, "a", -1, 0.0))
    ev.inflight_total = 1
    assert reclamation(ev).maybe_reclaim(0.0, 1.0, [(-1, 1.0), (-2, 1.0)]) == []
    assert ended == []


async def test_controller_evicts_for_a_queued_critical_request(make_fc: MakeFC) -> None:
    fc = make_fc(FlowControlConfig(enable_eviction=True), saturation=lambda: 1.0)
    ended: Ended = []
    assert fc.track_inflight("shed", -1, lambda err: ended.append("shed"))
    assert not fc.track_inflight("std", 0, lambda err: ended.append("std"))  # not sheddable
    fc.started(-1, "t")
    fc.started(0, "t")
    waiting = asyncio.ensure_future(fc.enqueue_and_wait(
        FlowControlRequest("crit", priority=10)))
    for _ in range(20):
        await asyncio.sleep(0.01)
        if ended:
            break
    assert ended == ["shed"]
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_without_eviction_nothing_is_tracked(make_fc: MakeFC) -> None:
    fc = make_fc(FlowControlConfig(), saturation=lambda: 1.0)
    assert not fc.track_inflight("shed", -1, lambda err: None)
    assert fc.reclamation is None
    assert await fc.enqueue_and_wait(FlowControlRequest("x", ttl=0.02)) is Outcome.EVICTED_TTL


def test_an_eviction_policy_without_enable_eviction_is_a_config_error() -> None:
    from epp.config import ConfigError, build, parse_config
    text = "featureGates: [flowControl]\nplugins:\n- type: sheddable-eviction-filter\n"
    with pytest.raises(ConfigError, match="enableEviction: true"):
        build(parse_config(text, source="c.yaml"))
    runtime = build(parse_config(text + "flowControl: {enableEviction: true}\n"))
    assert runtime.flow_control is not None and runtime.flow_control.reclamation is not None
    [configured] = runtime.handle.find(SheddableEvictionFilter)
    assert runtime.flow_control.reclamation.evictor.filter is configured
