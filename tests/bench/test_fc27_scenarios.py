"""Issue #27's figures as scenario data: Gamma arrivals, targets on a request class, and
the scenarios that use them (bursts with priorities, Gamma CV 2)."""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import pytest

from bench import report as rp
from bench.scenario import SCENARIOS, ScenarioError, Target, load_scenario
from bench.workloads import gamma_arrivals


def test_gamma_arrivals_have_the_rate_and_the_cv_asked_for() -> None:
    times = gamma_arrivals(random.Random(1), 10.0, 20_000, cv=2.0)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.1, rel=0.05)
    assert statistics.pstdev(gaps) / mean == pytest.approx(2.0, rel=0.1)
    poisson = gamma_arrivals(random.Random(1), 10.0, 20_000, cv=1.0)
    pg = [b - a for a, b in itertools.pairwise(poisson)]
    assert statistics.pstdev(pg) / statistics.fmean(pg) == pytest.approx(1.0, rel=0.05)


def test_a_scenario_asks_for_gamma_arrivals_and_gets_them(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text("title: T\nworkload: {use: sharegpt, arrivals: {gamma: {cv: 2}}}\n"
                    "contenders: [envoy-rr]\n")
    wl = load_scenario(path).workload
    assert (wl.arrivals, wl.burst_period) == ("gamma", 2.0)
    a, b = wl.schedule(0.75, 20, 0, 8), wl.schedule(0.75, 20, 0, 8)
    assert [s.at for s in a] == [s.at for s in b]          # seeded
    gaps = [y.at - x.at for x, y in itertools.pairwise(a)]
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) > 1.4   # burstier than Poisson
    path.write_text("title: T\nworkload: {use: sharegpt, arrivals: {gamma: {cv: 0}}}\n"
                    "contenders: [envoy-rr]\n")
    with pytest.raises(ScenarioError, match=r"workload\.arrivals: .*gamma: \{cv: X > 0\}"):
        load_scenario(path)


def _run(name: str, seed: int, ttft: float, classes: dict[str, float]) -> rp.RunResult:
    return rp.RunResult("w", 0.75, 1.0, name, "ours", seed=seed, requests=10, ok=10,
                        ttft_p90=ttft, output_tps=100.0,
                        classes={c: {"requests": 5, "errors": 0, "ttft_p90": v}
                                 for c, v in classes.items()})


def test_a_class_target_compares_a_class_with_all_or_the_same_class_of_the_baseline() -> None:
    rows = [r for seed in range(5) for r in (
        _run("rr", seed, 4.0, {"interactive/interactive": 4.0, "standard/standard": 3.0}),
        _run("fc", seed, 3.0, {"interactive/interactive": 1.0, "standard/standard": 3.3}))]
    targets = [Target("fc", "rr", "TTFT p90", 0.35, True, "interactive", "all"),
               Target("fc", "rr", "TTFT p90", 1.05, True, "standard", "standard"),
               Target("fc", "rr", "TTFT p90", 1.0, True)]
    lines = rp.target_lines(rows, targets)
    assert lines[0].startswith("- w @ 0.75, fc (interactive requests): TTFT p90 / rr's (all "
                               "requests) = 0.25 [0.25, 0.25]"), lines[0]
    assert lines[0].endswith("**met**")
    assert "fc (standard requests): TTFT p90 / rr's (standard requests) = 1.10 [1.10, 1.10]" \
        in lines[1]
    assert lines[1].endswith("**not met**")
    assert "= 0.75 [" in lines[2] and "requests)" not in lines[2]


def test_the_scenario_loader_reads_class_targets_and_refuses_them_on_other_metrics(
        tmp_path: Path) -> None:
    head = "title: T\nworkload: tenants\ncontenders: [envoy-rr, epp-default]\ntargets:\n"
    path = tmp_path / "t.yaml"
    path.write_text(head + "- {ours: epp-default, class: chat, against: envoy-rr, "
                    "against_class: all, metric: TTFT p90, at_most: 0.5}\n"
                    "- {ours: epp-default, class: chat, against: envoy-rr, "
                    "metric: TTFT p90, at_most: 0.5}\n")
    t0, t1 = load_scenario(path).targets
    assert (t0.klass, t0.against_class, t1.klass, t1.against_class) == (
        "chat", "all", "chat", "chat")
    path.write_text(head + "- {ours: epp-default, class: chat, against: envoy-rr, "
                    "metric: output tok/s, at_least: 1}\n")
    with pytest.raises(ScenarioError, match=r"targets\[0\].metric: a class target"):
        load_scenario(path)


def test_bursts_with_priorities_sends_a_fifth_interactive_in_bursts() -> None:
    scn = load_scenario(SCENARIOS / "bursts-priorities.yaml")
    specs = scn.workload.schedule(0.75, scn.workload.duration, 0, 8)
    share = sum(s.headers["x-gateway-inference-objective"] == "interactive"
                for s in specs) / len(specs)
    assert 0.15 < share < 0.25
    assert scn.workload.arrivals == "bursts"
    assert {t.klass for t in scn.targets} == {"interactive", "standard", "all"}
