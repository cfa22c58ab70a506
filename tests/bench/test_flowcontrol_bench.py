"""The flow-control figures' own arithmetic and wiring: goodput within the flood window and
Jain's index over max-min fair shares (``bench.report.tenant_fairness``), the bound models
(``bench.models``), and the scenario configs' flow-control settings."""

from __future__ import annotations

import pytest

from bench.openloop import Outcome
from bench.report import tenant_fairness
from bench.scenario import SCENARIOS, load_scenario
from bench.workloads import RequestSpec
from epp.config import build, load_config_file


def spec(tag: str, at: float, max_tokens: int) -> RequestSpec:
    return RequestSpec(at, "/v1/completions", {"max_tokens": max_tokens}, tag=tag)


def test_tokens_count_when_they_reach_the_client_within_the_window() -> None:
    specs = [spec("a", 0.0, 4), spec("b", 1.0, 4), spec("c", 11.0, 5)]
    outcomes = [
        Outcome(0, start=0.0, status=200, ttft=1.0, output_tokens=4, itl=[1.0, 1.0, 1.0]),
        Outcome(1, start=1.0, status=200, ttft=5.0, output_tokens=3, itl=[3.0, 3.0]),  # 6, 9, 12
        Outcome(2, start=11.0, status=200, ttft=0.1, output_tokens=5, itl=[0.1] * 4),
    ]
    # a: 4 of 4 asked, b: 2 of 4 asked; c arrived after the window (no demand): fair shares
    # of the 6 delivered are 3 and 3, so a got 4/3 and b 2/3 of theirs.
    assert tenant_fairness(specs, outcomes, 10.0) == pytest.approx(
        (4 / 3 + 2 / 3) ** 2 / (2 * ((4 / 3) ** 2 + (2 / 3) ** 2)))


def test_without_recorded_gaps_tokens_are_spread_from_first_to_last() -> None:
    specs = [spec("a", 0.0, 11), spec("b", 0.0, 11)]
    outcomes = [Outcome(0, start=0.0, status=200, ttft=0.0, e2e=20.0, output_tokens=11),
                Outcome(1, start=0.0, status=200, ttft=0.0, e2e=10.0, output_tokens=11)]
    # a: 1 + 10 x 10/20 = 6 tokens by t=10, b: all 11; fair shares 8.5 each
    xs = [6 / 8.5, 11 / 8.5]
    assert tenant_fairness(specs, outcomes, 10.0) == pytest.approx(
        sum(xs) ** 2 / (2 * sum(x * x for x in xs)))


def test_jain_is_one_at_the_fair_shares_and_low_when_one_tenant_takes_them() -> None:
    """Max-min fair shares fill the small demands first: quiet tenants asking 10 each and a
    noisy one asking 100, with 100 delivered, are fair at 10/10/10/70."""
    def run(got: dict[str, int]) -> float:
        specs = [spec(t, 0.0, 100 if t == "noisy" else 10) for t in got]
        outcomes = [Outcome(i, start=0.0, status=200 if n else 429, ttft=0.0, e2e=0.0,
                            output_tokens=n) for i, n in enumerate(got.values())]
        return tenant_fairness(specs, outcomes, 10.0)

    assert run({"q1": 10, "q2": 10, "q3": 10, "noisy": 70}) == pytest.approx(1.0)
    assert run({"q1": 2, "q2": 2, "q3": 2, "noisy": 94}) < 0.6
    assert run({"q1": 0, "q2": 0, "q3": 0, "noisy": 0}) == 0.0  # nothing delivered


def test_a_tenant_scenario_reports_jain_in_virtual_time() -> None:
    from bench.runner import _Job, _virtual, plan

    scn = load_scenario(SCENARIOS / "noisy-tenant.yaml")
    p = plan(scn, seeds=[0], duration=4, servers=2,
             contenders=["envoy-rr", "epp-flowcontrol-least-c12-p1"])
    results = _virtual(_Job(p, scn.loads[0], 0))
    assert all(0.2 < r.jain <= 1.0 for r in results), [(r.contender, r.jain) for r in results]


def test_burst_bound_orders_a_burst_as_each_policy_says() -> None:
    from bench.models.burst_bound import global_queue, prefill, round_robin

    def req(at: float, tokens: int) -> RequestSpec:
        return RequestSpec(at, "/v1/completions", {"prompt": "abc " * tokens})

    # one server, a long prompt then two short ones arriving together
    burst = [req(0.0, 4000), req(0.0, 40), req(0.0, 40)]
    long_, short = prefill(burst[0]), prefill(burst[1])
    fcfs = global_queue(burst, 1, lambda s: s.at)
    sjf = global_queue(burst, 1, prefill)
    assert fcfs == pytest.approx([long_, long_ + short, long_ + 2 * short])
    assert sorted(sjf) == pytest.approx([short, 2 * short, 2 * short + long_])
    # two servers: round-robin puts the third request behind the long one
    assert round_robin(burst, 2)[2] == pytest.approx(long_ + short)


def test_ceiling_model_answers_every_critical_request_and_keeps_sheddable_ones_running() -> None:
    from bench.models.ceiling import run

    idle, idle_rate = run(0, 0.3, 20.0, seed=0, servers=2)
    busy, busy_rate = run(3, 0.3, 20.0, seed=0, servers=2)
    assert idle_rate == 0.0 and busy_rate > 0.5  # 3 in flight per server, each ~2-4 s
    assert len(idle) == len(busy) > 0            # same critical schedule, all answered
    # Sharing steps with sheddable prefills slows critical first tokens (deterministic here).
    assert sorted(busy)[len(busy) // 2] >= sorted(idle)[len(idle) // 2]


@pytest.mark.parametrize(("config", "limit"), [
    ("flowcontrol-least-c12-p1.yaml", 1), ("flowcontrol-least-c8-p1.yaml", 1),
    ("flowcontrol-least-c8.yaml", None), ("flowcontrol-fair-c8.yaml", None)])
def test_the_noisy_tenant_configs_carry_the_prefill_limit_to_the_detector(
        config: str, limit: int | None) -> None:
    runtime = build(load_config_file(SCENARIOS / "configs" / config))
    assert runtime.flow_control is not None
    assert runtime.saturation.params.max_prefill_concurrency == limit  # type: ignore[attr-defined]
