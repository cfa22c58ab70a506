"""``burst-prefix-cache-producer``: requests of one window that share a prompt are placed
together (up to ``maxPerReplica``), prefix-sharing singles join them under the fair share,
and ``prefix-cache-scorer`` reads the placement."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from epp.config import build
from epp.config.builtins import builtin_registry
from epp.config.loader import parse_config
from epp.requestcontrol.plugins.burst_prefix_cache_producer import (
    BurstPrefixCacheProducer,
    Entry,
    assign,
)
from epp.scheduling import LLMRequest
from shared.plugins import PluginError


def plugin(**params: Any) -> BurstPrefixCacheProducer:
    return builtin_registry().create("burst-prefix-cache-producer", "", params)


def req(i: int, prompt: bytes) -> LLMRequest:
    return LLMRequest(request_id=f"r{i}", target_model="m", prompt=prompt)


def entries(views: list[Any], prompts: list[bytes], p: BurstPrefixCacheProducer) -> list[Entry]:
    return [Entry(r, p.block_hashes(r), views) for r in
            (req(i, prompt) for i, prompt in enumerate(prompts))]


SHARED = b"x" * 4096  # 16 blocks of 64 tokens (256 bytes each)


def test_identical_prompts_go_to_one_replica(make_view) -> None:
    views = [make_view(i) for i in range(4)]
    es = entries(views, [SHARED] * 8, plugin())
    assign(es, -1, 0, False)
    assert len({e.assigned.key for e in es if e.assigned}) == 1
    assert all(e.assigned is not None for e in es)


def test_max_per_replica_fills_then_spills_to_the_least_loaded(make_view) -> None:
    views = [make_view(i) for i in range(4)]
    es = entries(views, [SHARED] * 8, plugin())
    assign(es, 3, 0, False)
    assert sorted(Counter(e.assigned.key for e in es if e.assigned).values()) == [2, 3, 3]


def test_two_groups_are_balanced_and_unrelated_singles_get_no_affinity(make_view) -> None:
    views = [make_view(i) for i in range(2)]
    other = b"y" * 4096
    es = entries(views, [SHARED] * 4 + [other] * 4 + [b"z" * 4096], plugin())
    assign(es, -1, 0, False)
    a = {e.assigned.key for e in es[:4] if e.assigned}
    b = {e.assigned.key for e in es[4:8] if e.assigned}
    assert len(a) == len(b) == 1 and a != b
    assert es[8].assigned is None


def test_min_colocate_blocks_joins_prefix_sharing_singles(make_view) -> None:
    views = [make_view(i) for i in range(3)]
    p = plugin(minColocateBlocks=8)
    prompts = [SHARED] * 3 + [SHARED[:3072] + b"tail-a" * 200, SHARED[:3072] + b"tail-b" * 200]
    es = entries(views, prompts, p)
    assign(es, -1, 8, False)
    group = es[0].assigned
    assert group is not None
    # fair share ceil(5/3) = 2: the group's replica is full, so the singles co-locate apart
    # from it but together
    assert es[3].assigned is not None and es[4].assigned is not None
    es2 = entries(views, prompts, p)
    assign(es2, -1, 0, False)
    assert es2[3].assigned is None and es2[4].assigned is None


def test_balance_by_tokens_spreads_long_prefixes(make_view) -> None:
    views = [make_view(i) for i in range(2)]
    long_a, long_b, short = b"a" * 8192, b"b" * 8192, b"c" * 1024
    es = entries(views, [long_a] * 2 + [long_b] * 2 + [short] * 2, plugin())
    assign(es, -1, 0, True)
    keys = [e.assigned.key for e in es if e.assigned]
    assert keys[0] != keys[2]  # the two long prefixes land on different replicas


async def test_a_window_places_concurrent_requests_and_the_scorer_reads_it(make_view) -> None:
    rt = build(parse_config("""\
plugins:
- type: burst-prefix-cache-producer
  parameters: {windowDurationMs: 50}
- type: prefix-cache-scorer
- type: max-score-picker
"""))
    (burst,) = rt.handle.find(BurstPrefixCacheProducer)
    scorer = rt.handle.plugin("prefix-cache-scorer", object)
    assert scorer.producer is burst
    views = [make_view(i) for i in range(4)]
    requests = [req(i, SHARED) for i in range(6)]
    t0 = time.monotonic()
    await asyncio.gather(*(burst.admit(r, views) for r in requests))
    assert time.monotonic() - t0 >= 0.045  # everyone waited for the window
    picks = {rt.scheduler.schedule(r, views).endpoints[0].key for r in requests}
    assert len(picks) == 1 and burst.windows == 1
    scores = scorer.score(requests[0], views)
    assert sorted(scores) == [0.0, 0.0, 0.0, 1.0]


async def test_a_full_window_lets_the_request_go_without_affinity(make_view) -> None:
    burst = plugin(maxBatchSize=1, windowDurationMs=20)
    views = [make_view(i) for i in range(2)]
    first = burst.admit(req(0, SHARED), views)
    assert burst.admit(req(1, SHARED), views) is None
    await first


@pytest.mark.parametrize(("params", "why"), [
    ({"windowDurationMs": 0}, "windowDurationMs"), ({"windowDurationMs": 10001}, "windowDuration"),
    ({"maxPerReplica": 0}, "maxPerReplica"), ({"blockSizeTokens": 0}, "blockSizeTokens"),
    ({"maxPrefixTokensToMatch": 10}, "maxPrefixTokensToMatch"),
    ({"minColocateBlocks": -1}, "minColocateBlocks"), ({"maxBatchSize": 0}, "maxBatchSize"),
    ({"balanceBy": "bytes"}, "must be one of"),
])
def test_bad_parameters_are_refused(params: dict[str, Any], why: str) -> None:
    with pytest.raises(PluginError, match=why):
        plugin(**params)
