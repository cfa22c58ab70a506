"""``token-budget-admitter``: tenants held to tokens per minute, counted exactly from each
response's usage, shared by two replicas through one real Valkey, failing open when it dies."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from devkit.valkey import ValkeyServer
from epp.config import ConfigError, build, parse_config
from epp.flowcontrol.budgets import (
    BudgetExceeded,
    BudgetLedger,
    TokenBudgetAdmitter,
    TokenBudgetParameters,
)
from epp.requestcontrol.plugin import Response
from epp.scheduling.request import LLMRequest
from epp.statestore import ValkeyStateStore, parse_store_url


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def req(tenant: str, prompt_tokens: int = 10) -> LLMRequest:
    return LLMRequest(request_id="r", target_model="m", prompt_tokens=prompt_tokens,
                      headers={"x-gateway-inference-fairness-id": tenant})


def done(admitter: TokenBudgetAdmitter, request: LLMRequest, prompt: int,
         completion: int) -> None:
    admitter.response_complete(request, Response("r", prompt_tokens=prompt,
                                                 completion_tokens=completion), None)  # type: ignore[arg-type]


def admitter(store: Any = None, **params: Any) -> TokenBudgetAdmitter:
    a = TokenBudgetAdmitter("budget", TokenBudgetParameters(**params), store)
    a.ledger.clock = Clock()
    return a


def test_the_window_slides_and_says_when_it_frees() -> None:
    clock = Clock(100.0)
    ledger = BudgetLedger(clock)
    ledger.charge("t", 600)
    clock.now = 130.0
    ledger.charge("t", 500)
    assert ledger.used("t") == 1100
    assert ledger.seconds_until_allowed("t", 1000, burst=60) == 160 - 130  # 100 leaves at 160
    clock.now = 161.0  # the first bucket has left the window
    assert ledger.used("t") == 500


def test_a_tenant_over_budget_gets_429_with_retry_after_others_do_not() -> None:
    a = admitter(tokens_per_minute=1000)
    first = req("noisy", prompt_tokens=100)
    assert a.admit(first, []) is None
    done(a, first, prompt=700, completion=350)  # exact: 1050 > 1000
    with pytest.raises(BudgetExceeded) as e:
        a.admit(req("noisy"), [])
    assert e.value.status == 429 and e.value.retry_after == 60
    assert e.value.extra_headers == {"x-llm-d-request-dropped-reason": "rejected-token-budget"}
    assert a.admit(req("quiet"), []) is None


def test_past_its_burst_a_tenant_waits_for_its_even_pace() -> None:
    """6,000 tokens a minute with a 10 s burst: at most 100 x (w + 10) in any w seconds."""
    a = admitter(tokens_per_minute=6000)
    first = req("t", prompt_tokens=1000)
    assert a.admit(first, []) is None          # 1,000 < 1,100 (w = 1)
    assert a.admit(req("t", prompt_tokens=500), []) is None   # still 1,000 < 1,100
    with pytest.raises(BudgetExceeded) as e:   # 1,500 >= 1,100; in 5 s 1,500 < 100 x 16
        a.admit(req("t"), [])
    assert e.value.retry_after == 5
    assert a.ledger.seconds_until_allowed("t", 6000, burst=60) == 0  # the minute alone admits


@pytest.mark.parametrize("burst", [10.0, 60.0])
def test_a_tenant_sending_3x_its_budget_is_admitted_at_an_even_pace(burst: float) -> None:
    """100-token requests at 300 tokens a second against 6,000 a minute, for 3 minutes:
    every minute holds the budget. With the 10 s burst each minute is a 10 s burst (2x the
    pace), 40 s at the pace (1,000 per 10 s) and a 10 s pause; the minute's cap alone
    (``burst: 60s``) lets the whole budget through in the first 20 s of each minute."""
    a = admitter(tokens_per_minute=6000, burst=burst)
    clock = a.ledger.clock
    assert isinstance(clock, Clock)
    start, admitted = clock.now, []
    for i in range(3 * 60 * 3):
        clock.now = start + i / 3
        with contextlib.suppress(BudgetExceeded):
            a.admit(r := req("t", prompt_tokens=100), [])
            done(a, r, prompt=60, completion=40)
            admitted.append(clock.now - start)
    per_10s = [sum(100 for t in admitted if s <= t < s + 10) for s in range(60, 180, 10)]
    per_minute = [sum(100 for t in admitted if s <= t < s + 60) for s in range(60, 121, 30)]
    assert per_minute == [6000] * 3
    if burst == 60:
        assert per_10s == [3000, 3000, 0, 0, 0, 0] * 2
    else:
        assert per_10s == [2000, 1000, 1000, 1000, 1000, 0] * 2


def test_counts_are_exact_from_usage_not_the_estimate() -> None:
    a = admitter(tokens_per_minute=10_000)
    r = req("t", prompt_tokens=5000)
    a.admit(r, [])
    assert a.ledger.used("t") == 5000  # reserved at admission
    done(a, r, prompt=120, completion=30)
    assert a.ledger.used("t") == 150


def test_per_tenant_budgets_override_the_default() -> None:
    a = admitter(tokens_per_minute=10, tenants={"vip": 0, "small": 5})
    assert a.budget("vip") == 0 and a.budget("small") == 5 and a.budget("other") == 10
    for _ in range(3):
        assert a.admit(req("vip", prompt_tokens=100), []) is None  # 0: no budget


async def test_queue_mode_holds_the_request_until_the_window_frees() -> None:
    a = admitter(tokens_per_minute=100, on_exceed="queue")
    clock = a.ledger.clock
    assert isinstance(clock, Clock)
    a.ledger.charge("t", 150)
    waiting = asyncio.ensure_future(a.admit(req("t"), []))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    clock.now += 61
    await asyncio.wait_for(waiting, 2)
    assert a.ledger.used("t") == 10  # its reservation


async def test_queue_mode_gives_up_after_max_wait() -> None:
    a = admitter(tokens_per_minute=100, on_exceed="queue", max_wait=0.2)
    a.ledger.charge("t", 150)
    with pytest.raises(BudgetExceeded):
        await a.admit(req("t"), [])


def test_a_budget_without_any_limit_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no budget set"):
        build(parse_config("plugins:\n- type: token-budget-admitter\n"))


@pytest.mark.parametrize("burst", ["0s", "90s"])
def test_a_burst_outside_the_minute_is_a_config_error(burst: str) -> None:
    with pytest.raises(ConfigError, match="burst: must be > 0s and <= 60s"):
        build(parse_config("plugins:\n- type: token-budget-admitter\n  parameters: "
                           f"{{tokensPerMinute: 10, burst: {burst}}}\n"))


def test_it_is_an_admitter_of_the_runtime() -> None:
    runtime = build(parse_config(
        "plugins:\n- type: token-budget-admitter\n  parameters: {tokensPerMinute: 5}\n"))
    assert any(isinstance(x, TokenBudgetAdmitter) for x in runtime.admitters)
    assert any(isinstance(x, TokenBudgetAdmitter) for x in runtime.response_complete)


async def test_two_replicas_hold_one_budget_through_valkey_and_fail_open() -> None:
    with ValkeyServer() as server:
        url = parse_store_url(server.url + "?timeout=2")
        stores = [ValkeyStateStore(url, pool="ns/pool", replica=r) for r in ("a", "b")]
        a, b = (admitter(s, tokens_per_minute=1000, burst=60)  # the minute's cap alone
                for s in stores)
        b.ledger.clock = a.ledger.clock  # one second on both replicas
        assert a.sharing is not None and b.sharing is not None
        try:
            first = req("t", prompt_tokens=10)
            assert a.admit(first, []) is None
            done(a, first, prompt=500, completion=100)  # 600 on replica a
            await a.sharing.sync()
            await b.sharing.sync()
            assert b.ledger.used("t") == 600  # b sees a's tokens
            second = req("t", prompt_tokens=10)
            assert b.admit(second, []) is None
            done(b, second, prompt=400, completion=50)  # 1050 pool-wide
            await b.sharing.sync()
            await a.sharing.sync()
            with pytest.raises(BudgetExceeded):
                a.admit(req("t"), [])  # one budget: a refuses for b's tokens too
            with pytest.raises(BudgetExceeded):
                b.admit(req("t"), [])
            server.kill()
            await b.sharing.sync()  # the store is gone: b falls back to its own 450
            assert not b.sharing.up
            assert b.admit(req("t"), []) is None  # fails open, no error
        finally:
            for x in (a, b):
                assert x.sharing is not None
                await x.sharing.aclose()
