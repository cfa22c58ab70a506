"""Smoke test of ``python -m bench.statestore_bench``: every figure it reports is produced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_statestore_bench_reports_every_figure() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.statestore_bench", "--ops", "200",
                           "--repeats", "1", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    ops = {"add_inflight", "inflight", "prefix_add_16", "prefix_match_16", "session_set",
           "session_get"}
    assert set(result["request_path"]["memory"]) == ops
    assert set(result["request_path"]["valkey"]) == ops
    assert set(result["round_trip"]) == {"hincrby", "hgetall_100_fields"}
    assert set(result["background"]) == {"sync_0_picks", "sync_10_picks", "sync_100_picks",
                                         "propagation", "sync_pull_100_endpoints"}
    for figure in result["background"].values():
        assert figure["min_us"] <= figure["median_us"] <= figure["max_us"]
