"""Issue 18's benchmarks: what they count and how they judge (bench.active_active_faults,
bench.active_active_throughput; the routing figure is bench/scenarios/active-active.yaml).
Figures come from bench/ runs; here only the arithmetic and one short real run."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from bench.active_active_faults import FaultRun, hit_rate, own_in_flight
from bench.active_active_faults import report as fault_report
from bench.openloop import Outcome
from bench.twin.cpu import load_rounds

ROOT = Path(__file__).resolve().parents[2]


def test_a_replicas_own_requests_in_flight_leave_out_the_others() -> None:
    debug = {"endpoints": [
        {"inflight_requests": 5, "remote_inflight_requests": 2},
        {"inflight_requests": 1, "remote_inflight_requests": 1},
        {"inflight_requests": 0, "remote_inflight_requests": 0}]}
    assert own_in_flight(debug) == 3
    assert own_in_flight({}) == 0


def test_hit_rate_counts_only_completed_requests() -> None:
    ok = Outcome(index=0, status=200, ttft=0.1, prompt_tokens=100, cached_tokens=60)
    failed = Outcome(index=1, status=500, prompt_tokens=100, cached_tokens=0)
    assert hit_rate([ok, failed]) == 0.6
    assert hit_rate([failed]) == 0.0


def test_the_fault_report_shows_errors_beyond_the_killed_replicas_streams() -> None:
    runs = [FaultRun("replica", 0, requests=90, errors=5, in_flight_on_killed=4,
                     errors_sent_after_kill=1, load=3.0),
            FaultRun("valkey", 0, requests=90, errors=0, load=3.0,
                     hit={"before": 0.5, "during": 0.6, "after": 0.7, "all": 0.6})]
    args = argparse.Namespace(load=0.5, duration=30.0, servers=4, seeds="0")
    text = "\n".join(fault_report(runs, args))
    assert "| 0 | 90 | 5 | 4 | 1 | 1 | 0.000 |" in text
    assert "| valkey | 0 | 90 | 0 | 50.0 | 60.0 | 70.0 |" in text


def test_the_throughput_bench_runs_its_three_contenders_on_one_envoy(tmp_path: Path) -> None:
    saved = tmp_path / "cpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.active_active_throughput", "--seconds", "0.5",
         "--rounds", "1", "--concurrency", "4", "--save", str(saved)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for row in ("| 1 replica, no store |", "| 1 replica + Valkey |", "| 2 replicas + Valkey |",
                "req/s, 1 replica + Valkey / no store:", "2 replicas / 1 replica"):
        assert row in done.stdout
    # the replica twin's CPU model reads what the bench saved (bench.twin.cpu)
    rounds, header = load_rounds(saved)
    assert len(rounds) == 1 and header["cpus"] == os.cpu_count()
    assert rounds[0].alone.per_request > 0 and 0 <= rounds[0].shared.background < 1
