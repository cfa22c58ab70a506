"""The twin agrees with the real-time stack (simulator processes, real Envoy, the EPP
process) on a short case: TTFT p50/p90 and output tok/s within 15% for round-robin and
epp-default on the same schedule. The full comparison is ``make bench-agreement`` and
``python -m bench.twin.agreement --from-run`` (figures in bench/RESULTS.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.twin.agreement import TOLERANCE, live, table

#: Above this share of the machine's CPU busy with other work the real-time side measures
#: CPU-starved processes (scrapes late, simulator steps late), not the routing; the twin has
#: no such noise. Read from /proc/stat over two seconds: the 1-minute load average still
#: carries the parallel tests that ran just before this one (``make test``'s first phase).
BUSY = 0.5


def busy_share(seconds: float = 2.0) -> float:
    """The share of all CPU time spent outside idle/iowait over ``seconds``."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)

    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return 1 - (idle1 - idle0) / max(total1 - total0, 1)


pytestmark = pytest.mark.serial


def test_twin_and_real_time_agree_on_a_short_case(tmp_path: Path) -> None:
    if (busy := busy_share()) > BUSY:
        pytest.skip(f"{busy:.0%} of the CPU busy with other work: the real-time side would "
                    "measure CPU starvation, not routing")
    pairs = live("sharegpt", 0.6, seed=0, servers=4, duration=12.0, workdir=tmp_path / "1")
    if not all(p.agrees for p in pairs):
        # One 12 s real-time run right after the parallel phase has missed by 1-3 points
        # (epp-default's TTFT 13-16% over the twin, 2026-11-29) and agreed when run again:
        # a second run decides; two disagreeing runs fail.
        pairs = live("sharegpt", 0.6, seed=0, servers=4, duration=12.0,
                     workdir=tmp_path / "2")
    assert [p.real.contender for p in pairs] == ["envoy-rr", "epp-default"]
    assert all(p.real.ok > 50 and p.real.errors == 0 for p in pairs)
    # A table to read when this fails: real / twin / difference per metric.
    assert all(p.agrees for p in pairs), "\n".join(table(pairs)) + f"\ntolerance {TOLERANCE}"
