"""The approximate prefix-cache scorer and its index."""

from __future__ import annotations

import random

from epp.config import build_scheduler, parse_config
from epp.scheduling import LLMRequest
from epp.scheduling.plugins import PrefixCacheScorer
from epp.scheduling.plugins.prefix.prefix_cache_scorer import PrefixCacheParameters
from epp.scheduling.plugins.prefix.prefix_index import PrefixIndex
from epp.scheduling.result import ProfileResult, SchedulingResult

PROMPT = bytes(range(32, 96)) * 4  # 256 bytes = 4 blocks of 64


def req(prompt: bytes = PROMPT, model: str = "m", salt: str = "") -> LLMRequest:
    return LLMRequest(request_id="r", target_model=model, prompt=prompt, cache_salt=salt)


def commit(scorer: PrefixCacheScorer, request: LLMRequest, view) -> None:
    scorer.score(request, [view])
    scorer.post_pick(request, SchedulingResult({"p": ProfileResult("p", [view])}, "p"))


def test_prompt_is_cut_into_full_64_byte_blocks() -> None:
    assert len(PrefixCacheScorer().block_hashes(req(PROMPT + b"tail"))) == 4


def test_blocks_are_capped_at_max_prefix_blocks() -> None:
    scorer = PrefixCacheScorer("p", PrefixCacheParameters(max_prefix_blocks_to_match=2))
    assert len(scorer.block_hashes(req())) == 2


def test_model_seeds_the_hash_chain() -> None:
    s = PrefixCacheScorer()
    assert s.block_hashes(req(model="a")) != s.block_hashes(req(model="b"))


def test_cache_salt_separates_namespaces() -> None:
    s = PrefixCacheScorer()
    assert s.block_hashes(req(salt="x")) != s.block_hashes(req(salt="y"))


def test_unseen_prompt_scores_zero(make_view) -> None:
    assert list(PrefixCacheScorer().score(req(), [make_view(1)])) == [0.0]


def test_index_updates_only_after_the_pick(make_view) -> None:
    scorer, v = PrefixCacheScorer(), make_view(1)
    scorer.score(req(), [v])
    assert list(scorer.score(req(), [v])) == [0.0]


def test_score_is_matched_blocks_over_total(make_view) -> None:
    scorer, a, b = PrefixCacheScorer(), make_view(1), make_view(2)
    commit(scorer, req(PROMPT[:128]), a)  # a holds the first 2 of 4 blocks
    assert list(scorer.score(req(), [a, b])) == [0.5, 0.0]


def test_token_ids_are_hashed_in_token_blocks(make_view) -> None:
    scorer = PrefixCacheScorer("p", PrefixCacheParameters(block_size_tokens=16))
    r = LLMRequest(request_id="r", target_model="m", prompt_token_ids=list(range(40)))
    assert len(scorer.block_hashes(r)) == 2


def test_lru_evicts_the_oldest_block() -> None:
    index = PrefixIndex()
    index.add("a", [1, 2, 3], capacity=3)
    index.add("a", [4], capacity=3)
    assert (index.match([1]), index.match([2, 3, 4]), index.size) == ({}, {"a": 3}, 3)


def test_match_counts_only_consecutive_leading_blocks() -> None:
    index = PrefixIndex()
    index.add("a", [1, 3], capacity=10)
    assert index.match([1, 2, 3]) == {"a": 1}


def test_retain_forgets_removed_endpoints() -> None:
    index = PrefixIndex()
    index.add("a", [1, 2], capacity=10)
    index.add("b", [1], capacity=10)
    index.retain(frozenset({"b"}))
    assert (index.match([1, 2]), index.size) == ({"b": 1}, 1)


def test_server_reported_gpu_blocks_bound_its_lru(make_view) -> None:
    scorer, v = PrefixCacheScorer(), make_view(1, num_gpu_blocks=2)
    commit(scorer, req(), v)
    assert scorer.indexer_size == 2


def test_default_profile_sends_a_repeated_prefix_back_to_the_same_endpoint(make_view) -> None:
    views = [make_view(i) for i in range(8)]
    s = build_scheduler(parse_config(None), rng=random.Random(0))
    first = s.schedule(req(), views)
    s.post_pick(req(), first)
    again = s.schedule(req(), views)
    assert again.endpoints == first.endpoints


def test_hit_ratio_hook_reports_the_picked_endpoint_ratio(make_view) -> None:
    from epp.scheduling import SchedulerHooks

    ratios: list[float] = []
    views = [make_view(0)]
    s = build_scheduler(parse_config(None), hooks=SchedulerHooks(prefix_hit_ratio=ratios.append))
    for _ in range(2):
        r = req()
        s.post_pick(r, s.schedule(r, views))
    assert ratios == [0.0, 1.0]
