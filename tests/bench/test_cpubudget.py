"""CPU budgets for benchmark processes: a cgroup quota with the top weight where the machine
has a writable cgroup, else pinning; burners that stop with the block."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from bench.cpubudget import CpuBudget, budget_statement, burners

BUSY = [sys.executable, "-c", "while True: pass"]


@pytest.mark.serial
def test_a_busy_process_gets_no_more_than_its_budget() -> None:
    proc = subprocess.Popen(BUSY)
    try:
        with CpuBudget(0.2) as budget:
            budget.add(proc.pid)
            if budget.group is None:
                assert psutil.Process(proc.pid).cpu_affinity() == sorted(budget._cores)
                pytest.skip(f"no writable cgroup here ({budget.how}): pinning caps cores only")
            ps = psutil.Process(proc.pid)
            t0, c0 = time.monotonic(), sum(ps.cpu_times()[:2])
            time.sleep(1.5)
            used = (sum(ps.cpu_times()[:2]) - c0) / (time.monotonic() - t0)
            assert used < 0.3
            assert budget.throttled_seconds() > 0
    finally:
        proc.kill()
        proc.wait()


def test_the_group_is_removed_with_the_budget() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with CpuBudget(0.5) as budget:
            budget.add(proc.pid)
            group = budget.group
        if group is not None:
            assert not group.exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_budget_is_positive() -> None:
    with pytest.raises(ValueError):
        CpuBudget(0)


def test_the_statement_says_how_the_budget_holds() -> None:
    assert budget_statement(0) == ""
    text = budget_statement(1.5)
    assert text.startswith("1.5 CPU per router process (")
    assert "cpu.max 150000/100000" in text or "cfs_quota_us 150000/100000" in text \
        or "taskset" in text


def test_burners_run_for_the_block_only() -> None:
    with burners(2) as procs:
        assert len(procs) == 2
        assert all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)
