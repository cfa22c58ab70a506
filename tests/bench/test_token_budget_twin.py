"""The budget twin: two replicas sharing one Valkey hold a 3x tenant to one budget."""

from __future__ import annotations

import asyncio

from bench.token_budget_twin import one_run
from devkit.valkey import ValkeyServer


def test_two_replicas_hold_the_tenant_to_one_budget_within_5_percent() -> None:
    with ValkeyServer() as server:
        ratios = asyncio.run(one_run(server.url, 0, 2, None, server))
    assert len(ratios) == 4
    assert all(0.95 <= r <= 1.05 for r in ratios), ratios
