"""Token fairness as the toolkit measures it (bench/scenarios/token-fairness.yaml): a tenant's
``input_scale`` makes its prompts that much longer; :func:`bench.report.token_shares` counts
each tenant's tokens served inside a window; and in the twin, the token policy evens the
shares that request-count fairness leaves to the long-prompt tenant."""

from __future__ import annotations

import pytest

from bench.openloop import Outcome
from bench.report import jain, token_shares
from bench.scenario import SCENARIOS, load_scenario
from bench.workloads import FAIRNESS_HEADER, RequestSpec


def _spec(tag: str, prompt_tokens: int) -> RequestSpec:
    return RequestSpec(0.0, "/v1/completions", {"prompt": "abc " * prompt_tokens}, tag=tag)


def test_shares_count_prompts_at_first_token_and_outputs_inside_the_window() -> None:
    specs = [_spec("long", 1000), _spec("a", 500), _spec("b", 999), _spec("c", 7)]
    outcomes = [Outcome(0, 30.0, 200, 1.0, 2.0, 10),   # all inside [30, 60]: 1000 + 10
                Outcome(1, 27.0, 200, 1.0, 5.0, 40),   # first token before: half its output
                Outcome(2, 61.0, 200, 0.5, 1.0, 9),    # after the window: nothing
                Outcome(3, 31.0, 429)]
    got = token_shares(specs, outcomes, 30.0, 60.0)
    total = 1010 + 20
    assert got == pytest.approx({"long": 1010 / total, "a": 20 / total, "b": 0.0, "c": 0.0})


def test_jain_is_one_for_equal_shares_and_a_third_for_one_taker() -> None:
    assert jain([1 / 3] * 3) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0]) == pytest.approx(1 / 3)


def test_the_long_tenants_prompts_are_ten_times_longer() -> None:
    scn = load_scenario(SCENARIOS / "token-fairness.yaml")
    specs = scn.workload.schedule(1.8, 60.0, 300, 8)
    mean = {t: sum(len(s.body["prompt"]) for s in specs if s.tag == t)
            / sum(1 for s in specs if s.tag == t) for t in ("long/standard", "a/standard")}
    assert 7 < mean["long/standard"] / mean["a/standard"] < 13
    assert {s.headers[FAIRNESS_HEADER] for s in specs} == {"long", "a", "b"}


@pytest.mark.timeout(300)
def test_the_token_policy_evens_the_shares_request_fairness_leaves_to_long_prompts() -> None:
    from bench.runner import _Job, _virtual, plan

    p = plan(load_scenario(SCENARIOS / "token-fairness.yaml"), seeds=[300], duration=30.0)
    by = {r.contender: r.token_shares for r in _virtual(_Job(p, 1.8, 300))}
    assert by["request-fair"]["long/standard"] > 2 / 3    # > 2x its equal share
    assert jain(list(by["token-fair"].values())) > 0.9
    assert jain(list(by["token-fair"].values())) > jain(list(by["request-fair"].values()))
