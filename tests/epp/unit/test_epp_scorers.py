"""Scorer formulas."""

from __future__ import annotations

import pytest

from epp.datastore import LoraInfo
from epp.scheduling import LLMRequest
from epp.scheduling.plugins import (
    KVCacheUtilizationScorer,
    LoadAwareScorer,
    LoraAffinityScorer,
    QueueScorer,
    RunningRequestsSizeScorer,
    TokenLoadScorer,
)
from epp.scheduling.plugins.scorer.token_load_scorer import TokenLoadParameters

REQ = LLMRequest(request_id="r", target_model="m")


def test_queue_scorer_is_linear_between_min_and_max(make_view) -> None:
    views = [make_view(1, waiting=0), make_view(2, waiting=5), make_view(3, waiting=10)]
    assert list(QueueScorer().score(REQ, views)) == [1.0, 0.5, 0.0]


def test_queue_scorer_gives_one_when_all_equal(make_view) -> None:
    views = [make_view(1, waiting=4), make_view(2, waiting=4)]
    assert list(QueueScorer().score(REQ, views)) == [1.0, 1.0]


def test_queue_scorer_counts_picks_since_the_last_scrape(make_view) -> None:
    a, b = make_view(1, waiting=0), make_view(2, waiting=0)
    a.start_request()
    assert list(QueueScorer().score(REQ, [a, b])) == [0.0, 1.0]


def test_running_requests_scorer_prefers_fewer_running(make_view) -> None:
    views = [make_view(1, running=2), make_view(2, running=6)]
    assert list(RunningRequestsSizeScorer().score(REQ, views)) == [1.0, 0.0]


def test_kv_cache_scorer_is_one_minus_usage(make_view) -> None:
    views = [make_view(1, kv=0.25), make_view(2, kv=1.0)]
    assert list(KVCacheUtilizationScorer().score(REQ, views)) == [0.75, 0.0]


def test_token_load_scorer_falls_linearly_to_zero_at_the_cap(make_view) -> None:
    half, full = make_view(1), make_view(2)
    half.start_request(2_097_152)
    full.start_request(10_000_000)
    assert list(TokenLoadScorer().score(REQ, [half, full])) == [0.5, 0.0]


def test_token_load_scorer_cap_is_a_parameter(make_view) -> None:
    v = make_view(1)
    v.start_request(50)
    assert list(TokenLoadScorer("t", TokenLoadParameters(100)).score(REQ, [v])) == [0.5]


@pytest.mark.parametrize(
    ("running", "waiting", "max_lora", "expected"),
    [
        ({"a"}, set(), 1, 1.0),          # adapter active
        ({"x"}, set(), 4, 0.8),          # room for another adapter
        ({"x"}, {"a"}, 2, 0.6),          # adapter waiting, no room
        ({"x", "y"}, set(), 2, 0.0),     # full, not there
    ],
)
def test_lora_affinity_scores(make_view, running, waiting, max_lora, expected) -> None:
    v = make_view(1, lora=LoraInfo(max_lora, frozenset(running), frozenset(waiting)))
    req = LLMRequest(request_id="r", target_model="a", lora_adapter="a")
    assert list(LoraAffinityScorer().score(req, [v])) == [expected]


def test_lora_affinity_is_neutral_without_an_adapter(make_view) -> None:
    assert list(LoraAffinityScorer().score(REQ, [make_view(1), make_view(2)])) == [1.0, 1.0]


def test_load_aware_scorer_gives_half_for_an_empty_queue(make_view) -> None:
    views = [make_view(1, waiting=0), make_view(2, waiting=64), make_view(3, waiting=500)]
    assert list(LoadAwareScorer().score(REQ, views)) == [0.5, 0.25, 0.0]
