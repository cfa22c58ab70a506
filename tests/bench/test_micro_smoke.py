"""Smoke tests of ``python -m bench.micro``'s fleet-less subcommands: every figure each reports
is produced (``active-active`` is run by test_active_active_benches.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def micro(*args: str, timeout: float = 110) -> str:
    proc = subprocess.run([sys.executable, "-m", "bench.micro", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_statestore_reports_every_figure() -> None:
    result = json.loads(micro("statestore", "--ops", "200", "--repeats", "1", "--json"))
    ops = {"add_inflight", "inflight", "prefix_add_16", "prefix_match_16", "session_set",
           "session_get"}
    assert set(result["request_path"]["memory"]) == ops
    assert set(result["request_path"]["valkey"]) == ops
    assert set(result["round_trip"]) == {"hincrby", "hgetall_100_fields"}
    assert set(result["background"]) == {"sync_0_picks", "sync_10_picks", "sync_100_picks",
                                         "propagation", "sync_pull_100_endpoints"}
    for figure in result["background"].values():
        assert figure["min_us"] <= figure["median_us"] <= figure["max_us"]


def test_kv_index_reports_memory_throughput_score_and_lag() -> None:
    out = micro("kv-index", "--quick")
    assert out.count("memory: max_keys") == 2 and "-> 2,000 keys (<= max_keys)" in out
    assert "block events/s on one core" in out
    assert "score of a 4,096-token prompt over 8 endpoints" in out
    assert "sockets, paced at 20,000 block events/s: 2000 batches" in out
    assert "publish-to-indexed lag: p50 <=" in out


def test_kv_index_central_mode_indexes_through_a_bound_collector() -> None:
    out = micro("kv-index", "--quick", "--central")
    assert "sockets (centralized), as fast as possible: 2000 batches" in out


def test_a_subcommand_is_required() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.micro"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "required" in proc.stderr


def test_pick_reports_p50_and_p99_per_pool_size_and_the_route_cpu() -> None:
    out = micro("pick", "--requests", "100", "--clock", "cpu")
    assert out.count("endpoints=") == 3 and out.count("p99") == 3
    out = micro("pick", "--route", "--requests", "100", "--rounds", "2")
    assert out.startswith("route+finish CPU time: best ") and out.count(", ") == 1


def test_slo_pick_reports_default_idle_and_refitting() -> None:
    out = micro("slo-pick", "--requests", "100", "--endpoints", "5", "--fits", "1",
                timeout=200)
    assert "default profile p50" in out and "model idle p50" in out
    assert "fits during the phase) p50" in out


def test_rewrite_reports_the_rewriter_on_three_streams() -> None:
    rows = micro("rewrite", "--events", "400", "--rounds", "1").splitlines()[1:]
    assert [r[:20].strip() for r in rows] == ["compact (vLLM)", "spaced", "nothing to rename"]
    assert all(float(r.split()[-1]) > 0 for r in rows)


def test_rss_queued_holds_every_request_and_reads_the_epps_rss() -> None:
    res = json.loads(micro("rss", "--queued", "200", timeout=300))
    assert res["queued_seen"] == 200 and res["streams_ended_early"] == 0
    assert res["rss_queued_mib"] > 0 and res["second_round"]["queued_seen"] == 200
    assert res["alive"]
