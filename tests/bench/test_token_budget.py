"""Token budgets as the toolkit measures them (bench/scenarios/token-budget*.yaml): the
budgets are read from the contender's own EPP config, :func:`bench.report.budget_use`
counts a budgeted tenant's served tokens per minute window by arrival, and the twin refuses
to play a budget (it counts wall-clock minutes)."""

from __future__ import annotations

import pytest

from bench.openloop import Outcome
from bench.report import budget_use
from bench.runner import plan, token_budgets
from bench.scenario import SCENARIOS, load_scenario
from bench.workloads import RequestSpec


def _spec(tag: str) -> RequestSpec:
    return RequestSpec(0.0, "/v1/completions", {"prompt": "x"}, tag=tag)


def test_served_tokens_per_window_by_arrival_over_the_budget() -> None:
    specs = [_spec("noisy/standard"), _spec("noisy/standard"), _spec("noisy/standard"),
             _spec("quiet/standard"), _spec("noisy/standard")]
    outcomes = [Outcome(0, 61.0, 200, 0.5, 1.0, output_tokens=100, prompt_tokens=900),
                Outcome(1, 95.0, 200, 0.5, 1.0, output_tokens=50, prompt_tokens=450),
                Outcome(2, 100.0, 429),                         # refused: counts nothing
                Outcome(3, 70.0, 200, 0.5, 1.0, output_tokens=10, prompt_tokens=10),
                Outcome(4, 130.0, 200, 0.5, 1.0, output_tokens=0, prompt_tokens=1000)]
    got = budget_use(specs, outcomes, {"noisy": 1000}, 60.0, 150.0)
    # windows [60, 120) and [90, 150); quiet has no budget
    assert got == {"noisy": pytest.approx([1.5, 1.5])}
    assert budget_use(specs, outcomes, {"*": 500}, 60.0, 120.0) == {
        "noisy": pytest.approx([3.0]), "quiet": pytest.approx([0.04])}
    # a tenant whose own budget is 0 has none, whatever every other tenant's is
    assert budget_use(specs, outcomes, {"*": 500, "quiet": 0}, 60.0, 120.0) == {
        "noisy": pytest.approx([3.0])}


def test_the_budgets_come_from_the_contenders_config_and_stay_out_of_the_twin() -> None:
    scn = load_scenario(SCENARIOS / "token-budget.yaml")
    by_name = {c.name: c for c in scn.contenders}
    assert token_budgets(by_name["epp-budget"]) == {"*": 0, "noisy": 130000}
    assert token_budgets(by_name["quiet-alone"]) == {"*": 0, "noisy": 1}
    with pytest.raises(ValueError, match="token budgets count wall-clock minutes"):
        plan(scn, mode="virtual")
    assert plan(scn, mode="real").contenders == scn.contenders
