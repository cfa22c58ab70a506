"""Pickers."""

from __future__ import annotations

import random
from collections import Counter

from epp.scheduling import LLMRequest
from epp.scheduling.plugins import MaxScorePicker, RandomPicker, WeightedRandomPicker
from epp.scheduling.plugins.picker.max_score_picker import MaxScoreParameters
from epp.scheduling.plugins.picker.weighted_random_picker import WeightedRandomParameters

REQ = LLMRequest(request_id="r", target_model="m")


def test_max_score_picker_takes_the_highest(make_view) -> None:
    views = [make_view(i) for i in range(3)]
    picked = MaxScorePicker().pick(REQ, views, [0.1, 0.9, 0.5], random.Random(0))
    assert picked == [views[1]]


def test_max_score_picker_breaks_ties_at_random(make_view) -> None:
    views = [make_view(i) for i in range(3)]
    rng = random.Random(0)
    seen = Counter(
        MaxScorePicker().pick(REQ, views, [1.0, 1.0, 0.0], rng)[0].key for _ in range(400)
    )
    assert set(seen) == {views[0].key, views[1].key}
    assert min(seen.values()) > 150


def test_max_score_picker_returns_top_n_in_score_order(make_view) -> None:
    views = [make_view(i) for i in range(4)]
    picker = MaxScorePicker("p", MaxScoreParameters(max_num_of_endpoints=3))
    picked = picker.pick(REQ, views, [0.2, 0.9, 0.5, 0.7], random.Random(0))
    assert picked == [views[1], views[3], views[2]]


def test_random_picker_returns_distinct_endpoints(make_view) -> None:
    from epp.scheduling.plugins.picker.random_picker import RandomPickerParameters

    views = [make_view(i) for i in range(5)]
    picker = RandomPicker("p", RandomPickerParameters(max_num_of_endpoints=5))
    picked = picker.pick(REQ, views, [0.0] * 5, random.Random(1))
    assert sorted(v.key for v in picked) == sorted(v.key for v in views)


def test_weighted_random_picker_follows_scores(make_view) -> None:
    views = [make_view(0), make_view(1)]
    rng = random.Random(3)
    seen = Counter(
        WeightedRandomPicker().pick(REQ, views, [3.0, 1.0], rng)[0].key for _ in range(8000)
    )
    assert 0.72 < seen[views[0].key] / 8000 < 0.78


def test_weighted_random_picker_ranks_zero_scores_last(make_view) -> None:
    views = [make_view(0), make_view(1), make_view(2)]
    picker = WeightedRandomPicker("p", WeightedRandomParameters(max_num_of_endpoints=3))
    picked = picker.pick(REQ, views, [0.0, 1.0, 0.0], random.Random(5))
    assert picked[0] == views[1]
