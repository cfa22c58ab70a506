"""Intervals, verdicts, the cold-start split and the workload files of the routing bench."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.report import RunResult, summarize, table, target_lines
from bench.scenario import Target
from bench.stats import Interval, bootstrap_median, geomean_interval, paired_ratios, verdict
from bench.workloads import HERE, WORKLOADS, WorkloadError, load_workload


def test_bootstrap_interval_brackets_the_median_and_narrows_with_agreement() -> None:
    spread = bootstrap_median([0.5, 0.9, 1.3, 0.7, 1.1])
    tight = bootstrap_median([0.80, 0.81, 0.79, 0.80, 0.82])
    assert spread.lo <= spread.median <= spread.hi
    assert spread.median == pytest.approx(0.9)
    assert (tight.hi - tight.lo) < (spread.hi - spread.lo)
    assert tight.lo >= 0.79 and tight.hi <= 0.82
    # Reproducible: the resampling seed is fixed.
    assert bootstrap_median([0.5, 0.9, 1.3, 0.7, 1.1]) == spread


def test_ratios_are_paired_by_seed() -> None:
    assert paired_ratios({0: 1.0, 1: 4.0, 2: 9.0}, {1: 2.0, 0: 2.0, 3: 1.0}) == [0.5, 2.0]


@pytest.mark.parametrize(("iv", "verdict_at_most", "verdict_at_least"), [
    (Interval(0.6, 0.5, 0.7, 5), "met", "not met"),
    (Interval(0.85, 0.7, 0.95, 5), "inconclusive", "inconclusive"),
    (Interval(0.9, 0.85, 0.95, 5), "not met", "met"),
])
def test_verdict_needs_the_whole_interval_on_one_side(iv: Interval, verdict_at_most: str,
                                                      verdict_at_least: str) -> None:
    assert verdict(iv, 0.8, at_most=True) == verdict_at_most
    assert verdict(iv, 0.8, at_most=False) == verdict_at_least


@dataclass
class _Out:
    start: float
    ttft: float
    status: int = 200
    e2e: float | None = 1.0
    output_tokens: int = 10
    prompt_tokens: int = 100
    cached_tokens: int = 0
    pod: str = "p"
    error: str = ""
    itl: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == 200


def test_the_first_fifth_of_requests_is_reported_apart_as_the_cold_start() -> None:
    # 10 requests; the first 2 (by arrival, whatever their order in the list) are slow.
    outs = [_Out(start=float(i), ttft=9.0 if i < 2 else 0.1) for i in reversed(range(10))]
    res = summarize(RunResult("w", 0.5, 1.0, "c", "ours"), outs)
    assert res.requests == 8 and res.cold_requests == 2
    assert res.ttft_p90 == pytest.approx(0.1)
    assert res.cold_ttft_p90 == pytest.approx(9.0)


def _rows(ratios: list[float], point: tuple[str, float] = ("lora", 0.75)) -> list[RunResult]:
    rows = []
    for seed, x in enumerate(ratios):
        for name, kind, p90 in (("envoy-rr", "baseline", 2.0), ("epp-tuned", "ours", 2.0 * x)):
            rows.append(RunResult(point[0], point[1], 1.0, name, kind, seed=seed, servers=8,
                                  requests=10, ok=10, ttft_p90=p90, output_tps=100.0))
    return rows


def test_a_target_is_met_only_when_the_interval_supports_it() -> None:
    target = [Target("epp-tuned", "envoy-rr", "TTFT p90", 0.5, True)]
    met = "\n".join(target_lines(_rows([0.30, 0.32, 0.35, 0.31, 0.33]), target))
    assert "lora @ 0.75, epp-tuned: TTFT p90 / envoy-rr = 0.32" in met and "**met**" in met
    noisy = "\n".join(target_lines(_rows([0.2, 0.9, 0.3, 0.8, 0.4]), target))
    assert "**inconclusive**" in noisy
    worse = "\n".join(target_lines(_rows([0.9, 1.1, 1.0, 0.95, 1.05]), target))
    assert "**not met**" in worse


def test_table_shows_medians_and_intervals_and_skips_with_reasons() -> None:
    rows = _rows([0.5, 0.6, 0.55])
    rows.append(RunResult("lora", 0.75, 1.0, "sglang-router:cache_aware", "peer",
                          skipped="sglang-router not installed in .cache/peers/sglang-router"))
    text = "\n".join(table(rows))
    assert "| epp-tuned | 3 |" in text
    assert "0.55 [0.50, 0.60]" in text
    assert "| sglang-router:cache_aware | 0 | skipped: sglang-router not installed" in text


def test_workload_files_load_and_keep_their_shape() -> None:
    assert list(WORKLOADS)[:4] == ["shared-prefix", "lora", "sharegpt", "bursts"]
    for wl in WORKLOADS.values():
        assert wl.source and wl.per_server > 0
        a = wl.schedule(0.5, 5.0, seed=3, servers=8)
        assert a == wl.schedule(0.5, 5.0, seed=3, servers=8)
        assert a != wl.schedule(0.5, 5.0, seed=4, servers=8)
        # Twice the fleet, twice the requests for the same load.
        assert len(wl.schedule(0.5, 5.0, 3, 8)) == pytest.approx(
            2 * len(wl.schedule(0.5, 5.0, 3, 4)), abs=1)


@pytest.mark.parametrize(("edit", "message"), [
    ("colour: blue\n", "colour: unknown key"),
    ("", "missing key 'duration'"),
])
def test_a_bad_workload_file_names_the_file_and_field(tmp_path: Path, edit: str,
                                                       message: str) -> None:
    good = ((HERE / "lora.yaml").read_text() if edit
            else "\n".join(ln for ln in (HERE / "lora.yaml").read_text()
                           .splitlines() if not ln.startswith("duration")))
    path = tmp_path / "bad.yaml"
    path.write_text(good + "\n" + edit)
    with pytest.raises(WorkloadError, match=message) as e:
        load_workload(path)
    assert str(path) in str(e.value)


def test_a_bad_generator_parameter_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text((HERE / "lora.yaml").read_text()
                    .replace("zipf: 1.0", "zipff: 1.0"))
    with pytest.raises(WorkloadError, match=r"parameters.zipff: unknown key"):
        load_workload(path)


def test_multi_turn_prompts_extend_the_previous_turn_and_long_inputs_are_long() -> None:
    specs = WORKLOADS["multi-turn"].schedule(0.5, 20.0, seed=1, servers=2)
    by_conv: dict[str, list[str]] = {}
    for s in specs:
        by_conv.setdefault(s.tag, []).append(s.body["prompt"])
    assert max(len(v) for v in by_conv.values()) == 5
    for prompts in by_conv.values():
        for before, after in itertools.pairwise(prompts):
            assert after.startswith(before) and len(after) > len(before)
    lengths = [len(s.body["prompt"]) // 4 for s in
               WORKLOADS["long-input"].schedule(0.75, 30.0, seed=0, servers=8)]
    assert min(lengths) >= 4000 and max(lengths) <= 16000


def test_the_geometric_mean_interval_contains_it_and_widens_with_spread() -> None:
    lo, hi = geomean_interval([0.5, 0.5, 0.5])
    assert abs(lo - 0.5) < 1e-9 and abs(hi - 0.5) < 1e-9
    lo, hi = geomean_interval([0.4, 0.5, 0.6, 0.5, 0.45])
    assert lo < 0.49 < hi < 0.6
    assert all(math.isnan(x) for x in geomean_interval([0.5]))
