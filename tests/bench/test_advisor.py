"""The P/D split advisor (``python -m bench advise``): the SLO test per request, the goodput
rule, and its output on a tiny sweep."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.twin.advisor import Cell, Slo, goodput, met_share, summarize
from bench.twin.pd import Served
from sim.costs import isolated_prefill
from sim.profiles import H100_LLAMA8B


def served(ttft: float, tpot: float, prompt: int) -> Served:
    return Served(long=True, ttft=ttft, tpot=tpot, output=100, prompt=prompt)


def test_a_request_meets_the_slo_by_its_own_prompts_isolated_prefill() -> None:
    slo = Slo(tpot=0.020)
    long_bound = 2 * isolated_prefill(H100_LLAMA8B, 30_000)   # > 0.5 s: the factor decides
    assert long_bound > 0.5
    reqs = [served(0.49, 0.019, 1_000),           # meets: under the 0.5 s floor
            served(0.51, 0.019, 1_000),           # misses: over the floor, 2x prefill is less
            served(long_bound * 0.99, 0.019, 30_000),   # meets: under 2x its prefill
            served(0.10, 0.021, 1_000)]           # misses: TPOT
    assert met_share(reqs, "h100-llama8b", slo) == pytest.approx(0.5)


def test_goodput_is_the_highest_rate_up_to_which_every_rate_met_the_slo() -> None:
    slo = Slo()
    rate_of = {1.0: 2.0, 2.0: 4.0, 3.0: 6.0}
    cells = [Cell((0, 0), 1.0, 0, (0.95,), 0), Cell((0, 0), 2.0, 0, (0.85,), 0),
             Cell((0, 0), 3.0, 0, (0.92,), 0),    # met again, but after a miss: not counted
             Cell((0, 1), 1.0, 0, (0.80,), 0), Cell((0, 1), 2.0, 0, (0.99,), 0),
             Cell((0, 1), 3.0, 0, (0.99,), 0)]
    assert goodput(cells, (0, 0), 0, 0, slo, rate_of) == 2.0
    assert goodput(cells, (0, 1), 0, 0, slo, rate_of) == 0.0


def test_summary_advises_the_split_with_the_highest_goodput() -> None:
    slo = Slo()
    rate_of = {1.0: 1.0, 2.0: 2.0}
    cells = []
    for seed in range(3):
        cells += [Cell((0, 0), 1.0, seed, (0.95,), 100.0), Cell((0, 0), 2.0, seed, (0.5,), 150.0),
                  Cell((0, 1), 1.0, seed, (0.95,), 99.0), Cell((0, 1), 2.0, seed, (0.95,), 190.0),
                  Cell((0, 2), 1.0, seed, (0.5,), 60.0), Cell((0, 2), 2.0, seed, (0.5,), 80.0)]
    rows, advised = summarize(cells, 3, [slo], rate_of)
    assert advised == (0, 1)
    by = {r.fleet[1]: r for r in rows}
    assert by[1].goodput == (2.0,) and by[1].ratio[0][0] == pytest.approx(2.0)
    # tok/s is compared only where both kept up: load 1.0 (99 / 100).
    assert by[1].tps_ratio[0] == pytest.approx(0.99) and by[1].tps_ratio[3] == 3
    # 2P+1D met the SLO at no rate: ratio 0 in every seed, and no interval is claimed.
    assert by[2].ratio[0][0] == 0 and all(math.isnan(x) for x in by[2].ratio[0][1:])
    # Without that split, no split beats the aggregated fleet: the advice is aggregated.
    rows, advised = summarize([c for c in cells if c.fleet != (0, 1)], 3, [slo], rate_of)
    assert advised == (0, 0)


def test_advise_prints_goodput_per_split_on_a_tiny_sweep(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scn = tmp_path / "tiny-split.yaml"
    scn.write_text("""
title: tiny split
fleet: {roles: {prefill: 1, decode: 2}, profile: h100-llama8b}
workload: {use: long-input, duration: 8}
contenders:
- aggregated
- {name: pd, pd: {threshold: 1024, prefill_pick: tokens}}
seeds: [0, 1]
loads: [0.5, 6]
""")
    assert main(["advise", str(scn), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    for row in ("| aggregated (3) |", "| 1P+2D", "| 2P+1D"):
        assert row in out
    assert "TPOT 20 ms" in out and "TPOT 30 ms" in out
    advice = out.strip().splitlines()[-1]
    assert advice.startswith("advice: ")
    advised = advice.removeprefix("advice: ")
    assert f"| {advised} **advised** |" in out and out.count("**advised**") == 1


def test_advise_refuses_an_unknown_profile(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "pd-split", "--profile", "nope", "--seeds", "1"]) == 2
    assert "unknown profile 'nope'" in capsys.readouterr().err
