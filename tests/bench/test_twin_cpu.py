"""The replica twin's CPU model (bench.twin.cpu): a replica is one core, a request waits while
its replica is busy, Envoy spreads the streams, and the measured costs come from the real
bench's --save file."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench.twin.cpu import (
    MEASURED,
    Cores,
    Draws,
    ProcessCpu,
    load_rounds,
    main,
    open_loop_waits,
    saturated_rps,
    sustainable_rps,
)
from bench.twin.loop import TwinConfig, run
from bench.twin.replicas import Replicas
from bench.workloads import MODEL, WORKLOADS

MS = 0.001


def test_one_replica_saturates_at_one_over_its_cost() -> None:
    draws = Draws.make(0, 5000, cv=1.0)
    got = saturated_rps(1, ProcessCpu(MS, 0.0), draws)
    assert got == pytest.approx(1000, rel=0.05)   # not unbounded: the core is the limit


def test_replicas_add_cores_and_the_syncs_take_their_share() -> None:
    draws = Draws.make(1, 5000, cv=0.0)
    one = saturated_rps(1, ProcessCpu(MS, 0.0), draws)
    assert saturated_rps(2, ProcessCpu(MS, 0.0), draws) == pytest.approx(2 * one, rel=0.01)
    assert saturated_rps(3, ProcessCpu(MS, 0.0), draws) == pytest.approx(3 * one, rel=0.01)
    # a store costing 10% more per request and 5% of the core in syncs
    shared = saturated_rps(2, ProcessCpu(1.1 * MS, 0.0, idle=0.05), draws)
    assert shared == pytest.approx(2 * one * 0.95 / 1.1, rel=0.01)


def test_a_request_waits_while_its_replica_is_busy() -> None:
    cores = Cores(1, ProcessCpu(MS, 0.0))
    assert cores.serve(0.0, MS) == (0, 0.0, MS)
    assert cores.serve(0.0, MS) == (0, MS, 2 * MS)        # queued behind the first
    assert cores.serve(0.010, MS) == (0, 0.010, 0.011)    # idle again: no wait


def test_round_robin_alternates_and_least_request_avoids_the_busy_replica() -> None:
    rr = Cores(2, ProcessCpu(MS, 0.0), "round-robin")
    lr = Cores(2, ProcessCpu(MS, 0.0), "least-request")
    for cores in (rr, lr):
        assert cores.serve(0.0, 10 * MS)[0] == 0     # a long pick on replica 0
        assert cores.serve(0.0, MS)[0] == 1
    r, start, _ = rr.serve(0.002, MS)
    assert (r, start) == (0, 0.010)                  # waits behind the long pick
    r, start, _ = lr.serve(0.002, MS)
    assert (r, start) == (1, 0.002)                  # replica 1 is idle


def test_background_stretches_every_pick() -> None:
    cores = Cores(1, ProcessCpu(MS, 0.0, idle=0.5))
    assert cores.serve(0.0, MS)[2] == pytest.approx(2 * MS)


def test_waits_grow_with_the_rate_and_the_sustainable_rate_sits_below_saturation() -> None:
    draws = Draws.make(2, 4000, cv=1.0)
    cost = ProcessCpu(MS, 0.0)
    light = max(open_loop_waits(200, 1, cost, draws))
    heavy = max(open_loop_waits(900, 1, cost, draws))
    assert light < heavy
    tight = sustainable_rps(1, cost, draws, bound=0.005)
    loose = sustainable_rps(1, cost, draws, bound=0.5)
    assert 0 < tight < loose <= 1000
    # with Poisson arrivals two round-robin replicas see smoother arrivals than one replica:
    # at the same bound they sustain at least twice one replica's rate
    assert sustainable_rps(2, cost, draws, bound=0.005) >= 2 * tight


def test_the_saved_rounds_load_and_bad_files_say_why(tmp_path: Path) -> None:
    rounds, header = load_rounds(MEASURED)
    assert rounds and "command" in header
    assert all(alone > 0 and sharing > 0 for alone, sharing in rounds)
    bad = tmp_path / "cpu.json"
    bad.write_text(json.dumps({"rounds": [{"none_ms": 1.0}]}))
    with pytest.raises(SystemExit, match=r"cpu\.json: not a bench\.micro active-active"):
        load_rounds(bad)
    with pytest.raises(ValueError):
        ProcessCpu(-MS, 0.0)


def test_cli_pairs_each_seed_with_a_measured_round(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "cpu.json"
    saved.write_text(json.dumps({"command": "x", "rounds": [
        {"none_ms": 1.0, "shared_ms": 1.0, "background": 0.0},
        {"none_ms": 1.0, "shared_ms": 2.0, "background": 0.0}]}))
    assert main(["--cpu", str(saved), "--replicas", "2", "--seeds", "2", "--requests", "500",
                 "--cv", "0"]) == 0
    out = capsys.readouterr().out
    for name in ("epp-1-alone", "epp-1-shared", "epp-2-alone", "epp-2-shared"):
        assert f"| {name} | 2 |" in out
    # seed 0: sharing costs nothing, seed 1: it doubles the cost -> ratios 1.0 and 0.5
    assert "| epp-1-shared | 2 | 750 [500, 1000] | 0.75 [0.50, 1.00] |" in out
    assert "2 sharing replicas / 1 store-less replica" in out
    # the what-if: sharing replicas lose half their core to syncs on top
    assert main(["--cpu", str(saved), "--replicas", "1", "--seeds", "2", "--requests", "500",
                 "--cv", "0", "--background", "0.5"]) == 0
    assert "| epp-1-shared | 2 | 375 [250, 500] | 0.38 [0.25, 0.50] |" in capsys.readouterr().out


def test_the_routing_twin_delays_each_request_by_its_picks_wait_and_cost() -> None:
    """bench.twin.replicas with a CPU model: a request reaches its server when its pick is
    done, so a slow EPP adds its queueing to every TTFT; instant picks do not."""
    servers = 2
    specs = WORKLOADS["shared-prefix"].schedule(0.5, 6.0, 0, servers)
    cfg = TwinConfig(servers=servers, seed=0, model=MODEL)
    instant = run(specs, Replicas("x", cfg.keys(), 0, 1, shared=False), cfg)
    # a pick costing 0.5 s on one core: requests queue behind each other at the EPP
    slow = Replicas("x", cfg.keys(), 0, 1, shared=False, cpu=ProcessCpu(0.5, 0.0))
    delayed = run(specs, slow, cfg)
    assert not slow._owner   # every request released
    assert all(o.ok for o in delayed)
    waits = [(d.ttft or 0) - (i.ttft or 0) for d, i in zip(delayed, instant, strict=True)]
    assert statistics.median(waits) > 0.5
    # two replicas share the queue: less delay than one
    two = run(specs, Replicas("x", cfg.keys(), 0, 2, shared=True, cpu=ProcessCpu(0.5, 0.0)),
              cfg)
    assert all(o.ok for o in two)
    assert (statistics.median(o.ttft or 0 for o in two)
            < statistics.median(o.ttft or 0 for o in delayed))
