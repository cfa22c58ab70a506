"""``bench.twin.pd``: the virtual-time P/D fleets serve every request of the P/D mix, send
exactly the prompts above the threshold through a prefill server, and keep the engine's
timing (a decode server that never prefills decodes at the profile's ITL)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from bench.twin.pd import Served, Spill, parse_spill
from bench.twin.pd import simulate as simulate_specs
from bench.workloads import WORKLOADS, RequestSpec
from devkit.stats import percentile as pct
from sim.profiles import H100_8B


def workload(seed: int, rate: float = 0.6, duration: float = 60.0) -> list[RequestSpec]:
    """The P/D mix (bench/workloads/pd-mix.yaml) at ``rate`` req/s."""
    mix = WORKLOADS["pd-mix"]
    return mix.schedule(rate / mix.capacity(4), duration, seed, 4)


def simulate(seed: int, prefill: int, decode: int, threshold: int | None, *,
             rate: float = 0.6, duration: float = 60.0, **kw: Any) -> list[Served]:
    return simulate_specs(seed, prefill, decode, threshold,
                          specs=workload(seed, rate, duration), **kw)


def figures(served: Sequence[Served]) -> dict[str, float]:
    """Long-prompt TTFT/TPOT p90, short-prompt TTFT p90, the share of long prompts
    disaggregated."""
    long = [s for s in served if s.long]
    return {"long_ttft_p90": pct([s.ttft for s in long], .9),
            "long_tpot_p90": pct([s.tpot for s in long], .9),
            "short_ttft_p90": pct([s.ttft for s in served if not s.long], .9),
            "long_disagg": sum(s.disaggregated for s in long) / max(1, len(long))}


def test_every_request_is_served_once_by_each_fleet() -> None:
    specs = workload(0, 0.6, 20)
    assert specs
    for prefill, decode, threshold in ((2, 2, None), (2, 2, 1024), (3, 1, 1)):
        served = simulate(0, prefill, decode, threshold, duration=20)
        assert sorted(s.long for s in served) == sorted(s.tag == "long" for s in specs)


def test_disaggregated_long_prompts_decode_at_the_profiles_step_time() -> None:
    # Threshold 1: every prompt is prefilled elsewhere, so decode steps carry no prefill
    # except one token per arriving request.
    served = simulate(1, 2, 2, 1, duration=30)
    itl = H100_8B.inter_token_latency
    assert all(itl <= s.tpot < itl * 1.15 for s in served)
    aggregated = figures(simulate(1, 2, 2, None, duration=30))
    assert aggregated["long_tpot_p90"] > 1.3 * itl  # long prefills stall the decodes


def test_short_prompts_below_the_threshold_skip_the_prefill_servers() -> None:
    # A short prompt kept local starts at once on an idle decode server; sent through a
    # prefiller it waits for the prefill, the pull and the decode server's step.
    local = [s for s in simulate(2, 2, 2, 1024, duration=30) if not s.long]
    remote = [s for s in simulate(2, 2, 2, 1, duration=30) if not s.long]
    assert local and sum(s.ttft for s in local) < sum(s.ttft for s in remote)


def test_a_load_blind_prefill_pick_queues_long_prompts_on_one_prefiller() -> None:
    # 2 prefill servers: picking at random (llm-d's sample scorers on this workload) leaves
    # one idle while the other queues; the least-loaded picks (the prefill pick counted in
    # flight) keep long-prompt TTFT lower, by prompt tokens a little more.
    p90 = {pick: sum(figures(simulate(s, 2, 2, 1024, prefill_pick=pick))["long_ttft_p90"]
                     for s in range(4)) for pick in ("random", "least", "tokens")}
    assert p90["random"] > 1.2 * p90["least"]
    assert p90["tokens"] < p90["random"]


def test_a_spill_bound_no_prefill_backlog_reaches_keeps_every_long_prompt_disaggregated() -> None:
    never = figures(simulate(1, 2, 2, 1024, prefill_pick="tokens",
                             spill=Spill(prefill_tokens=10**9, decode_requests=10**9)))
    assert never["long_disagg"] == 1.0


def test_spilling_to_decode_pods_cuts_long_ttft_and_stalls_their_decodes() -> None:
    # 0.72 req/s: the two prefill servers queue bursts; with no bound on the decode pod every
    # backlogged long prompt is prefilled where requests decode.
    kept, spilled = ([figures(simulate(s, 2, 2, 1024, rate=0.72, prefill_pick="tokens",
                                       spill=spill)) for s in range(4)]
                     for spill in (None, Spill(prefill_tokens=8000)))
    assert all(f["long_disagg"] == 1.0 for f in kept)
    assert all(f["long_disagg"] < 1.0 for f in spilled)
    assert sum(f["long_ttft_p90"] for f in spilled) < sum(f["long_ttft_p90"] for f in kept)
    assert sum(f["long_tpot_p90"] for f in spilled) > sum(f["long_tpot_p90"] for f in kept)


def test_the_spill_decider_reads_both_bounds() -> None:
    s = Spill(prefill_tokens=8000, decode_requests=2)
    assert s.local(8000, 2) and not s.local(7999, 0) and not s.local(9000, 3)
    assert Spill(decode_requests=0).local(0, 0) and Spill(prefill_tokens=1).local(1, 99)


def test_spill_parses_or_fails_in_one_line() -> None:
    assert parse_spill("8000:2") == Spill(8000, 2)
    assert parse_spill("-:1") == Spill(None, 1)
    with pytest.raises(ValueError, match="expected PREFILL_TOKENS:DECODE_REQUESTS"):
        parse_spill("8000")
