"""The EPP's process CPU in the routing twin: picks and streamed tokens wait for the process,
first come first served, at its CPU budget; free when it costs nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.runner import twin_run as run_one
from bench.twin.cpu import ProcessCpu

ROOT = Path(__file__).resolve().parents[2]


def test_work_waits_for_the_process_first_come_first_served() -> None:
    cpu = ProcessCpu(per_request=1e-3, per_token=1e-4)
    assert cpu.run(0.0, 1e-3) == pytest.approx(1e-3)
    assert cpu.run(0.0005, 1e-3) == pytest.approx(2e-3)   # arrived while busy: waits
    assert cpu.run(0.01, 1e-3) == pytest.approx(0.011)    # idle again: at once


def test_a_smaller_budget_and_background_work_slow_the_process_down() -> None:
    assert ProcessCpu(0, 0, cpus=0.5).run(0.0, 1e-3) == pytest.approx(2e-3)
    assert ProcessCpu(0, 0, cpus=1.0, idle=0.5).run(0.0, 1e-3) == pytest.approx(2e-3)
    # one interpreter: a budget above one CPU is no faster than one
    assert ProcessCpu(0, 0, cpus=4.0).run(0.0, 1e-3) == pytest.approx(1e-3)


def test_the_measured_model_scrapes_every_pod_of_the_fleet(tmp_path: Path) -> None:
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"scrape_per_pod": 0.01, "contenders": {
        "EPP default profile": {"per_request": 1e-3, "per_token": 7e-5, "idle": 0.03}}}))
    assert ProcessCpu.measured(cost, 1.0, 8).idle == pytest.approx(0.08)
    assert ProcessCpu.measured(cost, 1.0, 32).idle == pytest.approx(0.32)


def test_a_model_with_no_room_for_work_is_refused() -> None:
    with pytest.raises(ValueError):
        ProcessCpu(1e-3, 1e-5, cpus=0.1, idle=0.2)
    with pytest.raises(ValueError):
        ProcessCpu(-1e-3, 1e-5)


def _figures(cpu: ProcessCpu | None) -> dict[str, object]:
    res = asdict(run_one("bursts", 0.75, 4, 5, "epp-default", 8.0, cpu=cpu))
    res.pop("wall_seconds")
    return res


def test_an_epp_that_costs_nothing_routes_as_the_free_one() -> None:
    assert _figures(ProcessCpu(0.0, 0.0)) == _figures(None)


def test_a_starved_epp_delays_first_tokens_and_the_stream() -> None:
    free = run_one("bursts", 0.75, 4, 5, "epp-default", 8.0)
    # ~600 tokens/s at 0.75 load on 4 servers: 3 ms each is twice what 1 CPU can pass on
    starved = run_one("bursts", 0.75, 4, 5, "epp-default", 8.0,
                      cpu=ProcessCpu(per_request=1e-3, per_token=3e-3))
    assert starved.ttft_p90 > 1.5 * free.ttft_p90
    assert starved.output_tps < 0.8 * free.output_tps


def test_the_cli_models_the_budget_from_a_saved_measurement(tmp_path: Path) -> None:
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"scrape_per_pod": 0.0075, "contenders": {
        "EPP default profile": {"per_request": 1e-3, "per_token": 7e-5, "idle": 0.03}}}))
    out = subprocess.run(
        [sys.executable, "-m", "bench", "run", "bursts", "--servers", "4",
         "--seeds", "1", "--duration", "4", "--contenders", "envoy-rr,epp-default",
         "--router-cpus", "0.5", "--epp-cost", str(cost), "--jobs", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "The EPP's CPU is modelled: 0.5 CPU, 1.00 ms per request, 70 µs per streamed " \
        "token, 3.00% of a CPU for scraping the 4 pods (from cost.json)" in out.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--router-cpus", "-1"], "--router-cpus: expected a CPU budget >= 0"),
    (["--router-cpus", "1", "--epp-cost", "/nonexistent/cost.json"],
     "/nonexistent/cost.json: cannot use the EPP's measured CPU costs"),
])
def test_bad_cpu_flags_end_with_one_line(args: list[str], message: str) -> None:
    out = subprocess.run([sys.executable, "-m", "bench", "run", "bursts", *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
