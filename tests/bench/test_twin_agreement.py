"""The twin agrees with the real-time stack (simulator processes, real Envoy, the EPP
process) on a short case: TTFT p50/p90 and output tok/s within 15% for round-robin and
epp-default on the same schedule. The full comparison is ``make bench-agreement`` and
``python -m bench.twin.agreement --from-run`` (figures in bench/RESULTS.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.twin.agreement import TOLERANCE, live, table

#: Above this 1-minute load per core the real-time side measures CPU-starved processes
#: (scrapes late, simulator steps late), not the routing; the twin has no such noise.
OVERLOADED = 1.5

pytestmark = pytest.mark.serial


def test_twin_and_real_time_agree_on_a_short_case(tmp_path: Path) -> None:
    if os.getloadavg()[0] > OVERLOADED * (os.cpu_count() or 1):
        pytest.skip(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: the "
                    "real-time side would measure CPU starvation, not routing")
    pairs = live("sharegpt", 0.6, seed=0, servers=4, duration=12.0, workdir=tmp_path)
    assert [p.real.contender for p in pairs] == ["envoy-rr", "epp-default"]
    assert all(p.real.ok > 50 and p.real.errors == 0 for p in pairs)
    # A table to read when this fails: real / twin / difference per metric.
    assert all(p.agrees for p in pairs), "\n".join(table(pairs)) + f"\ntolerance {TOLERANCE}"
