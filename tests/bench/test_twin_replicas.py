"""Active-active replicas in the twin (bench.twin.replicas): each replica sees its own picks at
once and the others' only through the modelled store, as the Valkey store behaves."""

from __future__ import annotations

from bench.twin.loop import TwinConfig, run
from bench.twin.replicas import Bus, Replicas
from bench.workloads import MODEL, WORKLOADS

A, B = "127.0.10.1:8000", "127.0.10.2:8000"


def test_own_counts_are_immediate_and_the_others_arrive_at_their_sync() -> None:
    bus = Bus(2, sync_interval=0.05)   # syncs: r0 at 0, 0.05; r1 at 0.025
    r0, r1 = bus.stores
    r0.add_inflight(A, 1, 100)
    assert r0.inflight(A).requests == 1
    assert r1.inflight(A).requests == 0
    bus.advance(0.0)     # replica 0 publishes
    assert r1.inflight(A).requests == 0   # ... but replica 1 has not pulled yet
    bus.advance(0.025)   # replica 1 pulls
    assert (r1.inflight(A).requests, r1.inflight(A).tokens) == (1, 100)
    assert r0.inflight(A).requests == 1   # not counted twice on the owner


def test_prefix_writes_reach_the_other_replica_after_the_pubsub_hop() -> None:
    bus = Bus(2, sync_interval=0.05, pubsub_latency=0.001)
    r0, r1 = bus.stores
    r0.prefix_add(A, [1, 2, 3], 0)
    assert r0.prefix_match([1, 2, 3]) == {A: 3}
    bus.advance(0.0)
    assert r1.prefix_match([1, 2, 3]) == {}
    bus.advance(0.001)
    assert r1.prefix_match([1, 2, 3]) == {A: 3}


def test_replicas_without_sharing_never_see_each_other() -> None:
    bus = Bus(2, shared=False)
    r0, r1 = bus.stores
    r0.add_inflight(A, 1)
    r0.prefix_add(B, [7], 0)
    bus.advance(10.0)
    assert r1.inflight(A).requests == 0
    assert r1.prefix_match([7]) == {}
    assert not r1.shared


def test_requests_alternate_over_the_replicas() -> None:
    cfg = TwinConfig(servers=2, seed=0, model=MODEL)
    router = Replicas("x", cfg.keys(), 0, 3, shared=True)
    specs = WORKLOADS["shared-prefix"].schedule(0.5, 4.0, 0, 2)
    run(specs, router, cfg)
    picks = [r.director for r in router.replicas]
    assert len(set(map(id, picks))) == 3
    assert router._next == len(specs) % 3
    assert not router._owner   # every request finished on the replica that picked it


def test_sharing_keeps_the_single_replicas_hit_rate_and_local_replicas_lose_it() -> None:
    """The active-active scenario's contenders in virtual time (one seed, a short run)."""
    from bench.runner import _Job, _virtual, plan
    from bench.scenario import SCENARIOS, load_scenario

    scn = load_scenario(SCENARIOS / "active-active.yaml")
    p = plan(scn, seeds=[0], duration=12.0,
             contenders=["epp-default", "epp-2-shared", "epp-2-local"])
    got = {r.contender: r for r in _virtual(_Job(p, 0.5, 0))}
    one = got["epp-default"].cache_hit
    assert got["epp-2-shared"].cache_hit >= one - 0.03
    assert got["epp-2-local"].cache_hit < one - 0.05
