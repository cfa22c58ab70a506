"""Smoke test of real time: ``python -m bench run smoke --real`` (``make bench-compare-quick``)
completes for every contender that can run here. A peer router that is not installed is not
a silent pass: the run prints a WARNING, this test repeats it as a pytest warning, and
``test_peer_routers_are_installed`` is skipped with the reason in the summary."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from bench.contenders import all_contenders
from bench.peers import PEERS

ROOT = Path(__file__).resolve().parents[2]


def _missing_peers() -> list[str]:
    return [p.package for p in PEERS.values() if p.problem()]


def test_every_contender_completes_a_short_run() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "smoke", "--real"],
                          cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = 0
    for name, contender in all_contenders().items():
        line = next((ln for ln in proc.stderr.splitlines() if f" {name} " in f" {ln} "), "")
        reason = contender.unavailable()
        if reason:
            assert "SKIPPED" in line and "not installed" in line, line
        else:
            assert " ok " in line and "FAILED" not in line, line
            ran += 1
    assert ran >= 5   # Envoy x3 and the EPP x2 always run
    missing = _missing_peers()
    if missing:
        assert "WARNING: NOT RUN here" in proc.stderr
        warnings.warn(f"peer routers NOT compared in this smoke run (not installed: "
                      f"{', '.join(missing)}); run `python -m bench.peers install`",
                      stacklevel=1)


def test_peer_routers_are_installed() -> None:
    missing = _missing_peers()
    if missing:
        pytest.skip(f"peer routers not installed ({', '.join(missing)}): the compare smoke "
                    "ran without them; `python -m bench.peers install` fixes this")
    for peer in PEERS.values():
        assert peer.version() != "?"


def test_the_epp_routes_under_a_cpu_budget_on_the_seeds_asked_for(tmp_path: Path) -> None:
    scenario = tmp_path / "budget.yaml"
    scenario.write_text(
        "title: Budgeted\nfleet: {servers: 2, time_scale: 0.25}\n"
        "workload: {use: shared-prefix, duration: 4}\n"
        "contenders: [epp-default, {name: epp-two, replicas: {count: 2, store: memory}}]\n"
        "loads: [0.3]\nseeds: [7]\n"
        "budget: {router_cpus: 0.5, gateway_cpus: 1, fleet_cpus: 1, client_cpus: 0.5, "
        "burners: 1}\n")
    proc = subprocess.run([sys.executable, "-m", "bench", "run", str(scenario), "--real"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("epp-default", "epp-two"):  # active-active replicas are budgeted too
        line = next(ln for ln in proc.stderr.splitlines() if f"seed 7 {name}" in ln)
        assert " ok " in line and ", router CPU " in line and " throttled " in line
    assert "seeds [7]" in proc.stdout
    assert "CPU budgets: 0.5 CPU per router process (" in proc.stdout
    assert "; 1 CPU per gateway Envoy (" in proc.stdout
    assert "; 1 CPU per simulator process (" in proc.stdout
    assert "; 0.5 CPU per client (" in proc.stdout
    assert "background CPU burners: 1." in proc.stdout
