"""The block index: exact stores and removals, longest-prefix scores, bounded memory."""

from __future__ import annotations

import pytest

from epp.kvcache import IndexConfig, KVBlockIndex, UnindexableEvent
from modelserver.kvevents import AllBlocksCleared, BlockRemoved, BlockStored

M = "base-model"
BS = 4


def tokens(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def stored(hashes: list[int], toks: list[int], parent: int | None = None,
           lora: str | None = None, block_size: int = BS) -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=toks,
                       block_size=block_size, lora_id=None, medium="GPU", lora_name=lora)


def index(**kw: int) -> KVBlockIndex:
    return KVBlockIndex(IndexConfig(block_size=BS, **kw))


def test_stored_blocks_score_as_the_longest_held_prefix() -> None:
    idx = index()
    t = tokens(3)
    idx.apply("a", stored([11, 12, 13], t), M)
    idx.apply("b", stored([21], t[:BS]), M)
    assert idx.score([*t, 99], M) == {"a": 3, "b": 1}
    assert idx.score(tokens(3, start=1000), M) == {}


def test_a_chain_continued_by_parent_hash_matches_the_whole_prompt() -> None:
    idx = index()
    t = tokens(4)
    idx.apply("a", stored([1, 2], t[: 2 * BS]), M)
    idx.apply("a", stored([3, 4], t[2 * BS :], parent=2), M)
    assert idx.score(t, M) == {"a": 4}


def test_engine_hash_scheme_does_not_matter_only_token_ids_do() -> None:
    idx = index()
    t = tokens(2)
    idx.apply("a", stored([1, 2], t), M)
    idx.apply("b", stored([2**64 - 5, 2**63], t), M)  # another server, another hash seed
    assert idx.score(t, M) == {"a": 2, "b": 2}


def test_removed_blocks_stop_matching_exactly() -> None:
    idx = index()
    t = tokens(3)
    idx.apply("a", stored([1, 2, 3], t), M)
    idx.apply("b", stored([1, 2, 3], t), M)
    assert idx.apply("a", BlockRemoved(block_hashes=[2], medium="GPU"), M) == 1
    assert idx.score(t, M) == {"a": 1, "b": 3}
    assert idx.endpoint_blocks() == {"a": 2, "b": 3}


def test_all_blocks_cleared_forgets_only_that_endpoint() -> None:
    idx = index()
    t = tokens(2)
    idx.apply("a", stored([1, 2], t), M)
    idx.apply("b", stored([1, 2], t), M)
    idx.apply("a", AllBlocksCleared(), M)
    assert idx.score(t, M) == {"b": 2}
    idx.apply("b", AllBlocksCleared(), M)
    assert len(idx) == 0


def test_lora_blocks_never_match_the_base_model_or_another_adapter() -> None:
    idx = index()
    t = tokens(2)
    idx.apply("a", stored([1, 2], t, lora="sql-lora"), M)
    assert idx.score(t, M) == {}
    assert idx.score(t, "other-lora") == {}
    assert idx.score(t, "sql-lora") == {"a": 2}


def test_unknown_parent_is_refused_and_changes_nothing() -> None:
    idx = index()
    with pytest.raises(UnindexableEvent) as info:
        idx.apply("a", stored([5], tokens(1), parent=404), M)
    assert info.value.reason == "unknown_parent"
    assert len(idx) == 0


def test_block_size_mismatch_and_non_uint32_tokens_are_refused() -> None:
    idx = index()
    with pytest.raises(UnindexableEvent) as info:
        idx.apply("a", stored([1], list(range(8)), block_size=8), M)
    assert info.value.reason == "block_size"
    with pytest.raises(UnindexableEvent) as info:
        idx.apply("a", stored([1], [2**32, 0, 0, 0]), M)
    assert info.value.reason == "bad_token_ids"


def test_key_count_is_bounded_oldest_stored_first() -> None:
    idx = index(max_keys=3)
    for i in range(5):
        idx.apply("a", stored([i], tokens(1, start=100 * i)), M)
    assert len(idx) == 3
    assert idx.evicted_keys == 2
    assert idx.score(tokens(1, start=0), M) == {}
    assert idx.score(tokens(1, start=400), M) == {"a": 1}
    assert idx.endpoint_blocks()["a"] <= 3


def test_endpoints_per_key_are_bounded_oldest_first() -> None:
    idx = index(max_endpoints_per_key=2)
    t = tokens(1)
    for ep in ("a", "b", "c"):
        idx.apply(ep, stored([1], t), M)
    assert idx.score(t, M) == {"b": 1, "c": 1}


def test_partial_trailing_block_is_not_scored() -> None:
    idx = index()
    t = tokens(1)
    idx.apply("a", stored([1], t), M)
    assert idx.request_keys(t[: BS - 1], M) == []
    assert idx.score([*t, 1, 2], M) == {"a": 1}


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="max_keys"):
        IndexConfig(max_keys=0)


@pytest.mark.parametrize("shared", [False, True], ids=["own-blocks", "shared-blocks"])
def test_the_memory_estimate_is_near_what_the_index_really_allocates(shared: bool) -> None:
    import gc
    import random
    import tracemalloc
    from array import array

    rng = random.Random(7)
    chains = [array("I", rng.randbytes(8 * 16 * 4)).tolist() for _ in range(600)]
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        idx = KVBlockIndex(IndexConfig(block_size=16))
        for ep in range(4):  # 4 endpoints: the same chains (shared) or their own
            for chain in chains:
                toks = chain if shared else [t ^ (ep + 1) for t in chain]
                hashes: list[int | bytes] = [rng.getrandbits(64) for _ in range(8)]
                idx.apply(f"ep{ep}", BlockStored(
                    block_hashes=hashes, parent_block_hash=None, token_ids=toks, block_size=16,
                    lora_id=None, medium="GPU", lora_name=None), M)
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(idx) == 600 * 8 * (1 if shared else 4)
    assert 0.7 < idx.estimated_bytes() / used < 1.3, (idx.estimated_bytes(), used)
