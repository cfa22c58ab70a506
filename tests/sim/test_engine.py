"""Engine behaviour on a virtual clock: deterministic, no sleeping."""

from __future__ import annotations

import dataclasses

import pytest

from sim.clock import run_virtual
from sim.engine import Engine, QueueFull, SimRequest
from sim.profiles import H100_8B, TINY, Profile


def text(n_tokens: int, tag: str = "x") -> bytes:
    """A prompt of exactly ``n_tokens`` tokens (4 bytes each), distinct per ``tag``."""
    unit = (tag * 4)[:4]
    return (unit * n_tokens).encode()


def make(engine: Engine, prompt: bytes, max_tokens: int, lora: str | None = None):
    return lambda t: engine.new_request(prompt, max_tokens, lora=lora, now=t)


def record(engine: Engine) -> list[tuple[str, str, float]]:
    events: list[tuple[str, str, float]] = []
    engine.on_event = lambda kind, req, t: events.append((kind, req.id, t))
    return events


def test_requests_beyond_max_num_seqs_wait_in_fifo_order() -> None:
    engine = Engine(TINY)  # max_num_seqs = 4
    reqs: list[SimRequest] = []

    def arrival(t: float) -> SimRequest:
        r = engine.new_request(text(8, str(len(reqs))), 10, now=t)
        reqs.append(r)
        return r

    for _ in range(6):
        engine.add(arrival(0.0))
    engine.begin_step(0.0)
    engine.finish_step()
    assert engine.num_running == 4
    assert engine.num_waiting == 2
    run_virtual(engine, [])
    # The 5th and 6th only start once the first batch has finished.
    first_batch_end = max(r.finish_time or 0 for r in reqs[:4])
    assert all((r.first_scheduled or 0) >= first_batch_end for r in reqs[4:])
    assert reqs[4].first_scheduled == pytest.approx(first_batch_end)


def test_waiting_queue_cap_raises_queue_full() -> None:
    engine = Engine(dataclasses.replace(TINY, max_waiting=2))
    for i in range(2):
        engine.add(engine.new_request(text(4, str(i)), 4))
    with pytest.raises(QueueFull):
        engine.add(engine.new_request(text(4, "z"), 4))


def test_repeated_prefix_lowers_ttft_through_cache_hit() -> None:
    engine = Engine(H100_8B)
    prompt = text(2000, "p")
    first = engine.new_request(prompt, 4)
    second = engine.new_request(prompt + b"another question", 4)
    run_virtual(engine, [(0.0, lambda t: first), (10.0, lambda t: second)])
    ttft1 = (first.first_token_time or 0) - first.arrival
    ttft2 = (second.first_token_time or 0) - second.arrival
    assert second.cached_tokens == 2000
    assert ttft1 == pytest.approx(0.030 + 2000 * 0.00025, rel=0.01)
    assert ttft2 < ttft1 / 5
    assert engine.prefix_hits_total == 2000


def test_idle_request_timing_follows_profile_formula() -> None:
    engine = Engine(H100_8B)
    req = engine.new_request(text(400), 11)
    run_virtual(engine, [(0.0, lambda t: req)])
    factor = 1 + 1.0 * 1 / 256  # one running request of 256
    assert req.first_token_time == pytest.approx(factor * (0.030 + 400 * 0.00025))
    decode = (req.finish_time or 0) - (req.first_token_time or 0)
    assert decode == pytest.approx(10 * factor * 0.012)


def test_busy_server_has_longer_inter_token_latency() -> None:
    profile = dataclasses.replace(TINY, max_num_seqs=8, load_factor=3.0)

    def mean_itl(concurrency: int) -> float:
        engine = Engine(profile)
        reqs = [engine.new_request(text(8, str(i)), 20) for i in range(concurrency)]
        run_virtual(engine, [(0.0, lambda t, r=r: r) for r in reqs])
        r = reqs[0]
        return ((r.finish_time or 0) - (r.first_token_time or 0)) / (r.generated - 1)

    assert mean_itl(8) > 2.0 * mean_itl(1)


def test_lru_evicts_least_recently_freed_prefix_tail_first() -> None:
    engine = Engine(dataclasses.replace(TINY, num_gpu_blocks=64, max_num_seqs=1))
    p1, p2, p3 = text(320, "a"), text(320, "b"), text(480, "c")  # 20, 20, 30 blocks
    reqs = [engine.new_request(p, 1) for p in (p1, p2, p3)]
    run_virtual(engine, [(float(i), lambda t, r=r: r) for i, r in enumerate(reqs)])
    kv = engine.kv
    h1, h2 = reqs[0].block_hashes, reqs[1].block_hashes
    assert kv.evictions > 0
    assert kv.match_prefix(h2) == len(h2)  # freed later: kept
    assert kv.match_prefix(h1) < len(h1)  # freed first: evicted ...
    assert kv.is_cached(h1[0]) and not kv.is_cached(h1[-1])  # ... from its tail


def test_decode_without_free_block_preempts_newest_request() -> None:
    # 8 blocks of 16; two 48-token prompts take 4 blocks each, so the first block boundary
    # during decode forces a preemption.
    engine = Engine(dataclasses.replace(TINY, num_gpu_blocks=8))
    events = record(engine)
    a = engine.new_request(text(48, "a"), 30)
    b = engine.new_request(text(48, "b"), 30)
    run_virtual(engine, [(0.0, lambda t: a), (0.0, lambda t: b)])
    assert ("preempt", b.id) in [(k, i) for k, i, _ in events]
    assert b.preemptions >= 1 and a.preemptions == 0
    assert a.generated == 30 and b.generated == 30
    assert (b.finish_time or 0) > (a.finish_time or 0)


def test_lora_request_waits_for_a_slot_and_pays_load_time() -> None:
    profile = dataclasses.replace(TINY, max_loras=1, lora_load_time=0.5)
    engine = Engine(profile)
    a = engine.new_request(text(8, "a"), 20, lora="ad-a")
    b = engine.new_request(text(8, "b"), 5, lora="ad-b")
    base = engine.new_request(text(8, "c"), 5)
    run_virtual(engine, [(0.0, lambda t: a), (0.001, lambda t: b), (0.001, lambda t: base)])
    assert (b.first_scheduled or 0) >= (a.finish_time or 0)  # slot busy until A finished
    assert (base.first_scheduled or 0) < (a.finish_time or 0)  # base model is not held up
    assert (b.first_token_time or 0) - (b.first_scheduled or 0) >= 0.5  # adapter load
    assert engine.loras.loads == 2


def test_resident_idle_adapter_is_reused_without_load() -> None:
    engine = Engine(dataclasses.replace(TINY, max_loras=1))
    first = engine.new_request(text(8, "a"), 2, lora="ad-a")
    again = engine.new_request(text(8, "b"), 2, lora="ad-a")
    run_virtual(engine, [(0.0, lambda t: first), (1.0, lambda t: again)])
    assert engine.loras.loads == 1


def test_time_scale_scales_event_times_but_not_order() -> None:
    def trace(scale: float) -> list[tuple[str, str, float]]:
        engine = Engine(dataclasses.replace(TINY, num_gpu_blocks=12), time_scale=scale)
        events = record(engine)
        arrivals = []
        for i in range(10):
            prompt = text(30 + 7 * i, "s" if i % 2 else str(i))
            arrivals.append((i * 0.003 * scale, make(engine, prompt, 30 + i)))
        run_virtual(engine, arrivals)
        return events

    slow, fast = trace(1.0), trace(0.1)
    assert [(k, i) for k, i, _ in slow] == [(k, i) for k, i, _ in fast]
    assert any(k == "preempt" for k, _, _ in slow)  # the scenario exercises the hard paths
    for (_, _, t1), (_, _, t2) in zip(slow, fast, strict=True):
        assert t2 == pytest.approx(0.1 * t1, abs=1e-9)


def test_output_length_equals_max_tokens_unless_random() -> None:
    fixed = Engine(TINY)
    assert fixed.new_request(b"hello", 50).output_tokens == 50
    lengths = []
    for _ in range(2):
        rnd = Engine(TINY, random_output_length=True, seed=7)
        lengths.append([rnd.new_request(b"hello", 50).output_tokens for _ in range(20)])
    assert lengths[0] == lengths[1]  # seeded
    assert len(set(lengths[0])) > 1 and all(1 <= n <= 50 for n in lengths[0])


def test_request_larger_than_kv_cache_is_rejected() -> None:
    engine = Engine(dataclasses.replace(TINY, num_gpu_blocks=4))
    with pytest.raises(ValueError, match="KV cache"):
        engine.add(engine.new_request(text(100), 10))


def test_abort_frees_blocks_and_slot() -> None:
    engine = Engine(TINY)
    req = engine.new_request(text(64), 100)
    engine.add(req)
    engine.begin_step(0.0)
    engine.finish_step()
    assert engine.kv.usage > 0
    engine.abort(req)
    assert engine.kv.usage == 0 and engine.num_running == 0 and req.done


def test_profile_override_rejects_unknown_field() -> None:
    with pytest.raises(ValueError, match="unknown profile field"):
        TINY.with_overrides({"itl": 1})
    assert isinstance(TINY.with_overrides({"max_num_seqs": 9}), Profile)


# -- the step's token budget (vLLM V1: max_num_batched_tokens, chunked prefill) ------------

BUDGETED = dataclasses.replace(H100_8B, max_num_batched_tokens=1000)


def test_h100_profile_has_vllm_v1_token_budget_and_chunked_prefill() -> None:
    assert H100_8B.max_num_batched_tokens == 8192
    assert H100_8B.enable_chunked_prefill


def test_a_prompt_over_the_budget_is_prefilled_in_chunks_and_gets_one_first_token() -> None:
    engine = Engine(BUDGETED)
    req = engine.new_request(text(2500, "a"), 3)
    events = record(engine)
    run_virtual(engine, [(0.0, lambda t: req)])
    # Three steps of 1000, 1000 and 500 prompt tokens, each with the prefill overhead; the
    # first token comes with the last chunk.
    factor = 1 + 1 / H100_8B.max_num_seqs
    chunks = factor * (3 * 0.030 + 2500 * 0.00025)
    assert (req.first_token_time or 0) == pytest.approx(chunks)
    assert [k for k, rid, _ in events if rid == req.id].count("first_token") == 1
    assert req.generated == 3


def test_a_long_prompt_stalls_a_running_decode_by_at_most_one_budget_per_step() -> None:
    engine = Engine(BUDGETED)
    decoder = engine.new_request(text(10, "d"), 40)
    long = engine.new_request(text(8000, "l"), 2)
    run_virtual(engine, [(0.0, lambda t: decoder), (0.05, lambda t: long)])
    assert decoder.finish_time is not None and long.first_token_time is not None
    # Each step mixes the decode with at most budget - 1 prompt tokens.
    bound = (1 + 2 / H100_8B.max_num_seqs) * (0.012 + 0.030 + 999 * 0.00025)
    gaps = (decoder.finish_time - (decoder.first_token_time or 0)) / (decoder.generated - 1)
    assert gaps <= bound
    # Without the budget the whole 8,000-token prompt stalls one step for ~2 s.
    free = Engine(dataclasses.replace(H100_8B, max_num_batched_tokens=100_000))
    d2 = free.new_request(text(10, "d"), 40)
    l2 = free.new_request(text(8000, "l"), 2)
    run_virtual(free, [(0.0, lambda t: d2), (0.05, lambda t: l2)])
    assert (d2.finish_time or 0) - (d2.first_token_time or 0) > 2.0


def test_prompts_waiting_together_are_served_first_come_first_served_within_the_budget() -> None:
    engine = Engine(BUDGETED)
    reqs = [engine.new_request(text(900, str(i)), 1) for i in range(5)]
    run_virtual(engine, [(0.0, lambda t, r=r: r) for r in reqs])
    firsts = [r.first_token_time or 0 for r in reqs]
    assert firsts == sorted(firsts)
    # The first prompt does not wait for the other four to be prefilled with it.
    assert firsts[0] < 0.35
    assert firsts[-1] > 4 * 900 * 0.00025


def test_without_chunked_prefill_a_prompt_that_does_not_fit_waits_for_the_next_step() -> None:
    engine = Engine(dataclasses.replace(BUDGETED, enable_chunked_prefill=False))
    a = engine.new_request(text(600, "a"), 1)
    b = engine.new_request(text(600, "b"), 1)
    engine.add(a)
    engine.add(b)
    engine.begin_step(0.0)
    assert engine.num_running == 1 and engine.num_waiting == 1
    engine.finish_step()
    assert a.first_token_time is not None
    # An empty step takes a prompt larger than the budget whole rather than never.
    big = engine.new_request(text(1500, "c"), 1)
    run_virtual(engine, [(1.0, lambda t: big)])
    assert big.first_token_time is not None and big.cached_tokens == 0


def test_a_zero_token_budget_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        H100_8B.with_overrides({"max_num_batched_tokens": 0})
