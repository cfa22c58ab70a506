"""Issue 18's benchmarks: fault steps of a real-time scenario run (bench.runner._faults;
the scenarios active-active-kill-*), ``python -m bench.micro active-active``; the routing figure is
bench/scenarios/active-active.yaml.
Figures come from bench/ runs; here only the arithmetic and one short real run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.contenders import Contender, EnvoyLB
from bench.runner import _faults
from bench.scenario import Fault
from bench.twin.cpu import load_rounds

ROOT = Path(__file__).resolve().parents[2]


class _Recorder(Contender):
    """A contender that only records the fault steps it is asked to do."""

    name = "recorder"

    def __init__(self) -> None:
        self.done: list[tuple[str, float]] = []
        self.t0 = time.monotonic()

    def fault(self, action: str) -> str:
        self.done.append((action, time.monotonic() - self.t0))
        return f"{action}: recorded"


def test_fault_steps_run_in_order_at_their_scaled_times(tmp_path: Path) -> None:
    c = _Recorder()
    faults = [Fault(0.4, "restart-store"), Fault(0.2, "kill-store")]
    with _faults(c, faults, 0.5, tmp_path):   # time scale 0.5: at 0.1 s and 0.2 s
        time.sleep(0.4)
    assert [a for a, _ in c.done] == ["kill-store", "restart-store"]
    assert 0.09 <= c.done[0][1] < 0.19 and 0.19 <= c.done[1][1] < 0.35
    lines = (tmp_path / "faults.txt").read_text().splitlines()
    assert [ln.split(": ", 1)[1] for ln in lines] == ["kill-store: recorded",
                                                      "restart-store: recorded"]


def test_steps_not_yet_due_when_the_run_ends_are_not_done(tmp_path: Path) -> None:
    c = _Recorder()
    with _faults(c, [Fault(30.0, "kill-replica")], 1.0, tmp_path):
        pass
    assert c.done == []
    assert (tmp_path / "faults.txt").read_text() == ""


def test_a_contender_without_replicas_says_a_fault_has_nothing_to_act_on() -> None:
    assert EnvoyLB("envoy-rr", "ROUND_ROBIN").fault("kill-replica") == (
        "kill-replica: nothing to act on in envoy-rr")


def test_the_throughput_bench_runs_its_three_contenders_on_one_envoy(tmp_path: Path) -> None:
    saved = tmp_path / "cpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.micro", "active-active", "--seconds", "0.5",
         "--rounds", "1", "--concurrency", "4", "--save", str(saved)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for row in ("| 1 replica, no store |", "| 1 replica + Valkey |", "| 2 replicas + Valkey |",
                "req/s, 1 replica + Valkey / no store:", "2 replicas / 1 replica"):
        assert row in done.stdout
    # the replica twin's CPU model reads what the bench saved (bench.twin.cpu)
    rounds, header = load_rounds(saved)
    assert len(rounds) == 1 and header["cpus"] == os.cpu_count()
    assert rounds[0][0] > 0 and rounds[0][1] > 0
