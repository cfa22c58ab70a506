"""Smoke test of ``python -m bench.epp_cpu --quick``: through the real Envoy, the EPP's, BBR's
and the no-op floor's CPU per request and per streamed token are measured under a CPU budget,
and ``--save`` keeps what the twin's ``--epp-cost`` reads; the idle cost of scraping simulator
pods is measured too; ``--mode BUFFERED`` runs every contender with buffered request bodies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.twin.cpu import ProcessCpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.envoy
def test_epp_cpu_measures_every_contender_and_saves_the_costs(tmp_path: Path) -> None:
    saved = tmp_path / "cost.json"
    proc = subprocess.run([sys.executable, "-m", "bench.epp_cpu", "--quick", "--tokens", "4,24",
                           "--concurrency", "8", "--token-gap-ms", "5", "--scrape-pods", "2",
                           "--bbr", "--save", str(saved)],
                          cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CPU budget per ext_proc process: 1 CPU (" in proc.stdout
    assert "| 2 |" in proc.stdout.split("scraping pools of simulator pods")[1]
    costs = json.loads(saved.read_text())["contenders"]
    assert set(costs) == {"no-op ext_proc (floor)", "EPP default profile", "EPP tuned profile",
                          "BBR"}
    for name, c in costs.items():
        assert c["per_token"] > 0, name   # every chunk crosses the ext_proc stream
        # 8 connections, 24 tokens 5 ms apart: the pods cannot answer faster than this
        assert 0 < c["rps"] <= 8 / (24 * 0.005), name
    # the EPP scrapes its pool while idle; the floor has nothing to do
    assert costs["EPP default profile"]["idle"] > costs["no-op ext_proc (floor)"]["idle"]
    cpu = ProcessCpu.measured(saved, 1.0, 4)
    assert cpu.per_token == costs["EPP default profile"]["per_token"]
    assert cpu.idle > 0   # scraping two simulator pods costs something


@pytest.mark.envoy
def test_buffered_mode_measures_bbr_beside_the_floor() -> None:
    """``--bbr --mode BUFFERED`` (was ``bench.micro bbr``): BBR's row and its ratio to the
    floor, every contender through a listener with buffered request bodies, no errors."""
    proc = subprocess.run([sys.executable, "-m", "bench.epp_cpu", "--quick", "--tokens", "2,6",
                           "--concurrency", "4", "--scrape-pods", "", "--bbr",
                           "--mode", "BUFFERED"],
                          cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BUFFERED request bodies" in proc.stdout
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| contender")}
    assert {"no-op ext_proc (floor)", "EPP default profile", "BBR"} <= set(rows)
    assert float(rows["BBR"][5].split()[0]) > 0      # BBR's req/s over the floor's
    rounds = [line for line in proc.stderr.splitlines() if line.startswith("round ")]
    assert len(rounds) == 4 and all(line.endswith("errors 0") for line in rounds), rounds
