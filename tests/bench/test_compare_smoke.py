"""Smoke test of the routing comparison: ``python -m bench.compare --quick`` completes for
every contender that can run here (peers not installed are skipped, with the reason)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.compare import RunResult, table
from bench.contenders import all_contenders

ROOT = Path(__file__).resolve().parents[2]


def test_every_contender_completes_a_short_run() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.compare", "--quick", "--no-progress"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, contender in all_contenders().items():
        line = next((ln for ln in proc.stderr.splitlines() if f" {name} " in f" {ln} "), "")
        reason = contender.unavailable()
        if reason:
            assert "SKIPPED" in line
        else:
            assert " ok " in line and "FAILED" not in line, line


def test_a_skipped_contender_is_reported_with_its_reason() -> None:
    rows = [RunResult("shared-prefix", 0.3, 1.0, "envoy-rr", "baseline", requests=5, ok=5,
                      ttft_p90=1.0, output_tps=10.0),
            RunResult("shared-prefix", 0.3, 1.0, "sglang-router:cache_aware", "peer",
                      skipped="sglang-router not installed in .cache/peers/sglang-router")]
    text = "\n".join(table(rows))
    assert "| sglang-router:cache_aware | skipped: sglang-router not installed" in text
