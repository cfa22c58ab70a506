"""Active-active replicas in the twin (bench.twin.replicas): each replica sees its own picks at
once and the others' only through the modelled store, as the Valkey store behaves."""

from __future__ import annotations

from pathlib import Path

import orjson

from bench.report import RunResult, summarize
from bench.twin.loop import TwinConfig, run
from bench.twin.replicas import Bus, Replicas, main, replay, run_seed
from bench.workloads import MODEL, WORKLOADS, write_specs

A, B = "127.0.10.1:8000", "127.0.10.2:8000"


def test_own_counts_are_immediate_and_the_others_arrive_at_their_sync() -> None:
    bus = Bus(2, sync_interval=0.05, flush_delay=None)   # syncs: r0 at 0, 0.05; r1 at 0.025
    r0, r1 = bus.stores
    r0.add_inflight(A, 1, 100)
    assert r0.inflight(A).requests == 1
    assert r1.inflight(A).requests == 0
    bus.advance(0.0)     # replica 0 publishes
    assert r1.inflight(A).requests == 0   # ... but replica 1 has not pulled yet
    bus.advance(0.025)   # replica 1 pulls
    assert (r1.inflight(A).requests, r1.inflight(A).tokens) == (1, 100)
    assert r0.inflight(A).requests == 1   # not counted twice on the owner


def test_the_flush_what_if_publishes_a_change_without_waiting_for_a_pull() -> None:
    bus = Bus(2, sync_interval=0.05, flush_delay=0.005, pubsub_latency=0.001)
    r0, r1 = bus.stores
    bus.advance(0.030)   # both synced once; the next syncs are at 0.05 and 0.075
    r0.add_inflight(A, 1, 100)
    bus.advance(0.0355)
    assert r1.inflight(A).requests == 0
    bus.advance(0.036)   # pushed at 0.035, delivered one hop later
    assert r1.inflight(A).requests == 1
    r0.add_inflight(A, -1, -100)
    bus.advance(0.042)
    assert r1.inflight(A).requests == 0


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
    got = run_seed(0, [("epp-1", 1, False, None), ("epp-2-shared", 2, True, None),
                       ("epp-2-local", 2, False, None)],
                   load=0.5, duration=12.0, servers=4, sync_interval=0.05)
    one = got["epp-1"].cache_hit
    assert got["epp-2-shared"].cache_hit >= one - 0.03
    assert got["epp-2-local"].cache_hit < one - 0.05


def test_replaying_a_runs_picks_reproduces_its_outcomes(tmp_path: Path) -> None:
    """A run directory as bench.active_active writes it: <seed>/<contender>/ with the
    schedule and the outcomes; the replay plays the same picks onto the twin's fleet."""
    servers = 4
    specs = WORKLOADS["shared-prefix"].schedule(0.5, 8.0, 1, servers)
    cfg = TwinConfig(servers=servers, seed=1, model=MODEL)
    router = Replicas("epp-1", cfg.keys(), 1, 1, shared=False)
    outcomes = run(specs, router, cfg)
    keys = cfg.keys()
    d = tmp_path / "1" / "epp-1"
    d.mkdir(parents=True)
    write_specs(specs, d / "requests.jsonl")
    (d / "outcomes.jsonl").write_bytes(b"".join(
        orjson.dumps({"index": o.index, "pod": f"sim-{keys.index(o.pod)}"}) + b"\n"
        for o in outcomes))
    again = replay(tmp_path)["epp-1"][1]
    original = summarize(RunResult("shared-prefix", 0.0, 0.0, "epp-1", "replay", seed=1,
                                   servers=servers), outcomes)
    assert again.ok == original.ok > 0
    assert (again.ttft_p90, again.cache_hit, again.pods) == (
        original.ttft_p90, original.cache_hit, original.pods)


def test_cli_prints_the_table_with_verdict_columns(capsys: object) -> None:
    assert main(["--replicas", "2", "--seeds", "1", "--duration", "6",
                 "--flush-delay", "0.005"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    for name in ("epp-2-shared", "epp-2-local", "epp-2-shared-flush"):
        assert f"| {name} | 1 |" in out
