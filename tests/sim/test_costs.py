"""The engine's cost model (``sim.costs``): its shape, and the published figures the
calibrated profiles reproduce (sources in sim/README.md, "Calibrated profiles")."""

from __future__ import annotations

import dataclasses

import pytest

from sim.clock import run_virtual
from sim.costs import decode_step, isolated_prefill, step_time
from sim.engine import Engine
from sim.profiles import (
    A100_LLAMA8B,
    H100_8B,
    H100_LLAMA8B,
    H100_LLAMA70B,
    PROFILES,
    get_profile,
)


def text(n_tokens: int, tag: str) -> bytes:
    return ((tag * 4)[:4] * n_tokens).encode()


def test_decode_step_grows_with_the_batchs_context() -> None:
    short = decode_step(H100_LLAMA8B, 32, 1_000)
    long = decode_step(H100_LLAMA8B, 32, 16_000)
    # 32 x 15,000 more context tokens at 0.105 us each, times the load factor.
    assert long - short == pytest.approx(32 * 15_000 * 1.05e-7 * (1 + 32 / 256), rel=1e-6)
    assert long > 1.5 * short


def test_prefill_is_superlinear_in_the_prompt_and_chunking_does_not_change_it() -> None:
    per_token = [isolated_prefill(H100_LLAMA8B, n) / n for n in (2_000, 8_000, 16_000, 32_000)]
    assert per_token == sorted(per_token)
    assert per_token[-1] > 1.3 * per_token[0]
    # Attention of a prompt is L^2 whatever the chunks: (0..a) then (a..L) sums to L^2.
    whole = step_time(H100_LLAMA8B, decoding=0, decode_context=0, chunks=[(0, 8_000)],
                      local_prefills=1, running=1)
    split = step_time(H100_LLAMA8B, decoding=0, decode_context=0,
                      chunks=[(0, 3_000), (3_000, 5_000)], local_prefills=1, running=1)
    assert split == pytest.approx(whole)


@pytest.mark.parametrize(("profile", "batch", "context", "published", "tolerance"), [
    # vLLM 0.4.2, Llama-3-8B on an H800, batch 1 (lmdeploy issue #1608): TPOT 8.66 ms at a
    # 1k prompt, 30 ms at 200k.
    (H100_LLAMA8B, 1, 1_024, 0.00866, 0.02),
    (H100_LLAMA8B, 1, 204_790, 0.030, 0.03),
    # NIM, Llama-3.3-70B FP8 on 2 x H100 (TP2), concurrency 1, 5,000 in / 500 out: ITL
    # 18.58 ms (context 5,000 + ~250 generated on average).
    (H100_LLAMA70B, 1, 5_250, 0.01858, 0.02),
])
def test_decode_calibration_points(profile, batch, context, published, tolerance) -> None:
    assert decode_step(profile, batch, context) == pytest.approx(published, rel=tolerance)


def test_prefill_calibration_point_70b() -> None:
    # NIM, Llama-3.3-70B FP8 on 2 x H100: TTFT 406.77 ms for 5,000 prompt tokens alone.
    assert isolated_prefill(H100_LLAMA70B, 5_000) == pytest.approx(0.40677, rel=0.03)


def test_h100_8b_prefill_is_in_the_range_the_issue_names() -> None:
    # 5-10x faster than the flat 250 us/token of ``8b-h100``: 25-50 us per token at 8k.
    assert 25e-6 <= isolated_prefill(H100_LLAMA8B, 8_000) / 8_000 <= 50e-6


def test_a100_is_slower_than_h100_by_its_bandwidth_and_compute() -> None:
    assert decode_step(A100_LLAMA8B, 8, 4_000) / decode_step(H100_LLAMA8B, 8, 4_000) == \
        pytest.approx(3.35 / 2.039, rel=1e-6)
    assert isolated_prefill(A100_LLAMA8B, 8_000) > 2.5 * isolated_prefill(H100_LLAMA8B, 8_000)


def test_old_profiles_keep_their_flat_costs() -> None:
    assert H100_8B.kv_read_time_per_token == 0 and H100_8B.prefill_attention_time == 0
    assert decode_step(H100_8B, 1, 100_000) == decode_step(H100_8B, 1, 10)
    assert isolated_prefill(H100_8B, 4_000) == pytest.approx(0.030 * (1 + 1 / 256)
                                                             + 4_000 * 250e-6 * (1 + 1 / 256))


def test_speed_divides_every_step() -> None:
    half = dataclasses.replace(H100_LLAMA8B, speed=0.5)
    assert decode_step(half, 4, 2_000) == pytest.approx(2 * decode_step(H100_LLAMA8B, 4, 2_000))
    assert isolated_prefill(half, 9_000) == pytest.approx(2 * isolated_prefill(H100_LLAMA8B, 9_000))
    enc = dict(decoding=0, decode_context=0, chunks=(), local_prefills=0, running=0,
               encode=0.040)
    assert step_time(half, **enc) == pytest.approx(2 * step_time(H100_LLAMA8B, **enc))
    with pytest.raises(ValueError, match="speed"):
        H100_LLAMA8B.with_overrides({"speed": 0})


def test_the_engine_times_steps_with_the_cost_model() -> None:
    """An idle engine's TTFT is the isolated prefill (chunked by the budget), and a request
    decoding next to a long context decodes slower than alone."""
    engine = Engine(H100_LLAMA8B)
    req = engine.new_request(text(20_000, "a"), 4)
    run_virtual(engine, [(0.0, lambda t: req)])
    assert req.first_token_time == pytest.approx(isolated_prefill(H100_LLAMA8B, 20_000))

    def tpot(prompt_tokens: int) -> float:
        e = Engine(H100_LLAMA8B)
        r = e.new_request(text(prompt_tokens, "b"), 50)
        run_virtual(e, [(0.0, lambda t: r)])
        assert r.finish_time is not None and r.first_token_time is not None
        return (r.finish_time - r.first_token_time) / 49

    assert tpot(30_000) == pytest.approx(decode_step(H100_LLAMA8B, 1, 30_025), rel=0.01)
    assert tpot(30_000) > 1.3 * tpot(100)


def test_profiles_are_selectable_by_name() -> None:
    for name in ("h100-llama8b", "h100-llama70b", "a100-llama8b", "8b-h100", "tiny"):
        assert get_profile(name).name == name
    assert set(PROFILES) >= {"h100-llama8b", "h100-llama70b", "a100-llama8b"}
