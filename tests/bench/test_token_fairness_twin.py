"""The token-fairness twin bench's measure: shares of tokens served inside the window."""

from __future__ import annotations

import pytest

from bench.flowcontrol_token_fairness_twin import DURATION, WARMUP, jain, schedule, shares


def test_shares_count_prompts_at_first_token_and_outputs_inside_the_window() -> None:
    served = [
        ("long", WARMUP + 1, WARMUP + 2, 1000, 10),     # all inside: 1000 + 10
        ("a", WARMUP - 2, WARMUP + 2, 500, 40),         # prompt before: half its output
        ("b", DURATION + 1, DURATION + 2, 999, 9),      # after the window: nothing
    ]
    got = shares(served, 1.0)
    total = 1010 + 20
    assert got == pytest.approx({"long": 1010 / total, "a": 20 / total, "b": 0.0})


def test_jain_is_one_for_equal_shares_and_a_third_for_one_taker() -> None:
    assert jain([1 / 3] * 3) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0]) == pytest.approx(1 / 3)


def test_the_long_tenants_prompts_are_ten_times_longer() -> None:
    specs = schedule(0, 8)
    mean = {t: sum(len(s.body["prompt"]) for s in specs if s.tag == t)
            / sum(1 for s in specs if s.tag == t) for t in ("long", "a")}
    assert 7 < mean["long"] / mean["a"] < 13
    assert {s.headers["x-gateway-inference-fairness-id"] for s in specs} == {"long", "a", "b"}
