"""Tokenizer and KV-cache accounting."""

from __future__ import annotations

from sim.kvcache import KVCache
from sim.tokenizer import apply_chat_template, block_hashes, count_tokens


def test_token_count_is_four_bytes_per_token_rounded_up() -> None:
    assert count_tokens(b"abcd" * 16) == 16
    assert count_tokens(b"abcde") == 2


def test_shared_text_prefix_gives_shared_block_hashes() -> None:
    base = b"system prompt " * 40
    h1 = block_hashes(base + b"question one", 16, "m")
    h2 = block_hashes(base + b"a different question", 16, "m")
    shared = len(base) // 64
    assert h1[:shared] == h2[:shared]


def test_block_hashes_depend_on_salt() -> None:
    data = b"x" * 256
    assert block_hashes(data, 16, "a")[0] != block_hashes(data, 16, "b")[0]


def test_chat_template_makes_multi_turn_prompts_extend_earlier_ones() -> None:
    turn1 = [{"role": "user", "content": "hello"}]
    turn2 = [*turn1, {"role": "assistant", "content": " the sim"},
             {"role": "user", "content": [{"type": "text", "text": "more"}]}]
    p1 = apply_chat_template(turn1)
    p2 = apply_chat_template(turn2)
    assert p2.startswith(p1.removesuffix("<|start_header_id|>assistant<|end_header_id|>\n\n"))


def test_allocation_fails_when_cache_is_full_and_nothing_is_evictable() -> None:
    kv = KVCache(num_blocks=4, block_size=16)
    table = kv.allocate([], 0, 4)
    assert kv.usage == 1.0
    assert not kv.can_allocate([], 0, 1)
    kv.free(table)
    assert kv.usage == 0.0 and kv.can_allocate([], 0, 4)


def test_cached_prefix_blocks_are_shared_not_duplicated() -> None:
    kv = KVCache(num_blocks=10, block_size=16)
    hashes = [1, 2, 3]
    t1 = kv.allocate(hashes, 0, 4)
    hit = kv.match_prefix(hashes)
    t2 = kv.allocate(hashes, hit, 4)
    assert hit == 3
    assert kv.num_free == 10 - 4 - 1  # the second request only added its own partial block
    kv.free(t1)
    kv.free(t2)
    assert kv.num_cached == 3 and kv.num_free == 10
