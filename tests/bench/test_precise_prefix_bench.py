"""``bench.precise_prefix_compare``: its flags, the pooled lag quantile, and a short run with
two EPP replicas behind a real Envoy (the streams reach both; the precise ones read events,
the sharing ones a real Valkey)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.peers import PEERS
from bench.precise_prefix_compare import Run, main, pooled_lag

ROOT = Path(__file__).resolve().parents[2]


def test_sharing_needs_a_second_replica(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--contenders", "approximate-shared"])
    assert exc.value.code == 2
    assert "approximate-shared needs --epp-replicas 2 or more" in capsys.readouterr().err


def test_the_lag_quantile_is_taken_over_every_runs_batches() -> None:
    def run(le_counts: dict[str, float]) -> Run:
        return Run([], 0, 0, 0, epp={f"lag_le_{k}": v for k, v in le_counts.items()})

    # One run alone: its one slow batch of 60 is its p99; with four quick runs it is not.
    slow = run({"0.01": 59, "0.5": 60, "inf": 60})
    quick = run({"0.01": 60, "0.5": 60, "inf": 60})
    assert pooled_lag([slow], 0.99) == 0.5
    assert pooled_lag([slow, quick, quick, quick, quick], 0.99) == 0.01
    assert math.isnan(pooled_lag([Run([], 0, 0, 0)], 0.99))  # no EPP, no figure


def bench(tmp_path: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """One seed of the benchmark with ``args``; its standard output and its figures."""
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.precise_prefix_compare", "--seeds", "1", *args,
         "--workdir", str(tmp_path), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, orjson.loads(out.read_bytes())


@pytest.mark.timeout(240)
def test_two_replicas_each_pick_and_the_report_compares_sharing(tmp_path: Path) -> None:
    stdout, figures = bench(tmp_path, "--requests", "12", "--epp-replicas", "2",
                            "--contenders", "precise,approximate-shared")
    assert figures["epp_replicas"] == 2
    for name in ("precise", "approximate-shared"):
        epp = figures["per_seed"][name]["1"]["epp"]
        assert epp["picks_0"] > 0 and epp["picks_1"] > 0, (name, epp)  # Envoy spreads
        assert epp["picks_0"] + epp["picks_1"] == 12
    assert figures["per_seed"]["precise"]["1"]["epp"]["lag_count"] > 0  # both subscribed
    assert "2 active-active replicas" in stdout
    assert "| hit rate precise / approximate-shared |" in stdout
    assert "KV-event lag p99 over all seeds'" in stdout


def test_peer_replicas_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--peer-replicas", "0"])
    assert exc.value.code == 2
    assert "--peer-replicas: at least 1" in capsys.readouterr().err


@pytest.mark.timeout(240)
def test_a_peer_scaled_out_runs_as_copies_behind_envoy(tmp_path: Path) -> None:
    if not PEERS["sglang-router"].installed():
        pytest.skip("sglang-router is not installed in .cache/peers (python -m bench.peers "
                    "install needs PyPI; CI does not install the peers)")
    stdout, figures = bench(tmp_path, "--requests", "8", "--peer-replicas", "2",
                            "--contenders", "sglang-router:cache_aware")
    run = tmp_path / "seed1" / "sglang-router-cache_aware"
    assert len((run / "command.txt").read_text().splitlines()) == 2  # two copies started
    assert figures["peer_replicas"] == 2
    run1 = figures["per_seed"]["sglang-router:cache_aware"]["1"]
    # Requests went through Envoy to the copies (only those in flight to the server killed
    # mid-run may fail).
    assert run1["failures"] < 8 and run1["ttft_p90_s"] > 0
    assert "peers: 2 processes each behind Envoy's round-robin" in stdout
