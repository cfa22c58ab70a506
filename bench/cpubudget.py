"""A fixed CPU budget for one process, as a Guaranteed pod's CPU (request = limit) gives it: a
cgroup with a CPU quota (the limit: cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us``) and the
highest weight (the request: whatever else runs on the machine cannot take those CPUs while
the process wants them), where the machine lets us write one; else pinning to whole cores
with ``sched_setaffinity`` (what ``taskset`` does: a cap, not a reservation). ``how`` says
which held, so a report can state it.

    with CpuBudget(1.0) as budget:
        budget.add(proc.pid)          # the process and the threads it starts later
        print(budget.how)             # "cgroup v1 cpu.cfs_quota_us 100000/100000 µs, ..."
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType

import psutil

PERIOD_US = 100_000
#: The highest weight each cgroup version takes (v2 ``cpu.weight``, v1 ``cpu.shares``).
WEIGHT_V2, SHARES_V1 = 10_000, 262_144
_V2 = Path("/sys/fs/cgroup")
_V1 = Path("/sys/fs/cgroup/cpu")


class CpuBudget:
    """``cpus`` CPUs for the processes added (a quota over every 100 ms period)."""

    def __init__(self, cpus: float, name: str | None = None) -> None:
        if cpus <= 0:
            raise ValueError(f"a CPU budget must be positive, not {cpus}")
        self.cpus = cpus
        self.name = name or f"bench-budget-{os.getpid()}-{id(self):x}"
        self.group: Path | None = None
        self.how = ""

    def __enter__(self) -> CpuBudget:
        quota = round(self.cpus * PERIOD_US)
        for make in (self._v2, self._v1):
            try:
                self.how = make(quota)
                return self
            except OSError:
                self._remove()
        cores = sorted(os.sched_getaffinity(0))[-max(1, math.ceil(self.cpus)):]
        self._cores = set(cores)
        self.how = f"taskset (cores {','.join(map(str, cores))}; no writable cgroup)"
        return self

    def _v2(self, quota: int) -> str:
        if not (_V2 / "cgroup.controllers").exists():
            raise OSError("no cgroup v2")
        self.group = _V2 / self.name
        self.group.mkdir()
        (self.group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        (self.group / "cpu.weight").write_text(str(WEIGHT_V2))
        return f"cgroup v2 cpu.max {quota}/{PERIOD_US} µs, cpu.weight {WEIGHT_V2}"

    def _v1(self, quota: int) -> str:
        if not (_V1 / "cpu.cfs_quota_us").exists():
            raise OSError("no cgroup v1 cpu controller")
        self.group = _V1 / self.name
        self.group.mkdir()
        (self.group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (self.group / "cpu.cfs_quota_us").write_text(str(quota))
        (self.group / "cpu.shares").write_text(str(SHARES_V1))
        return f"cgroup v1 cpu.cfs_quota_us {quota}/{PERIOD_US} µs, cpu.shares {SHARES_V1}"

    def add(self, pid: int) -> None:
        """Put ``pid`` (and every thread it starts from now on) under the budget."""
        if self.group is not None:
            (self.group / "cgroup.procs").write_text(str(pid))
        else:
            os.sched_setaffinity(pid, self._cores)

    def throttled_seconds(self) -> float:
        """How long the group was held back by its quota so far (0 without a cgroup)."""
        if self.group is None:
            return 0.0
        for line in (self.group / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_usec":
                return int(value) / 1e6
            if key == "throttled_time":  # v1: nanoseconds
                return int(value) / 1e9
        return 0.0

    def _remove(self) -> None:
        if self.group is None:
            return
        # Whatever is left in the group goes back to the root before it is removed.
        with contextlib.suppress(OSError):
            procs = (self.group / "cgroup.procs").read_text().split()
            root = self.group.parent / "cgroup.procs"
            for pid in procs:
                with contextlib.suppress(OSError):  # it exited meanwhile
                    root.write_text(pid)
            self.group.rmdir()
        self.group = None

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._remove()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) process ``pid`` has used; 0 once it is gone."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


#: What each CPU budget of a run is for (the keys of ``bench.scenario.Budget``).
BUDGETS = {"router_cpus": "router process", "gateway_cpus": "gateway Envoy",
           "fleet_cpus": "simulator process", "client_cpus": "client"}


def statement(budgets: Mapping[str, float]) -> str:
    """What each of ``budgets`` (:data:`BUDGETS`' keys; others are ignored) is on this
    machine, for a report."""
    return "; ".join(filter(None, (budget_statement(budgets.get(key, 0.0), what)
                                   for key, what in BUDGETS.items()))) or "none (whole machine)"


def budget_statement(cpus: float, what: str = "router process") -> str:
    """What a budget of ``cpus`` for each ``what`` is on this machine, for a report ("" for
    no budget)."""
    if not cpus:
        return ""
    with CpuBudget(cpus) as budget:
        return f"{cpus:g} CPU per {what} ({budget.how})"


@contextlib.contextmanager
def burners(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` busy-loop processes (other work on the machine) for as long as the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              stdin=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
