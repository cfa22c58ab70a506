"""llm-d-router v0.10's flow-control policies, and our token-fairness policy: each one's
behaviour on real queues."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from prometheus_client import REGISTRY

from epp.config import ConfigError, build, parse_config
from epp.flowcontrol import FlowControlConfig, FlowControlRequest, PriorityBandConfig
from epp.flowcontrol.admitter import FlowControlAdmitter
from epp.flowcontrol.policies import FCFSOrdering, SLODeadlineOrdering
from epp.flowcontrol.program_aware import ProgramAwareFairness, ProgramAwareParameters
from epp.flowcontrol.queues import Band
from epp.flowcontrol.token_fairness import TokenFairness
from epp.flowcontrol.types import QueueItem, TokenUsage, fairness_id
from epp.flowcontrol.usage_limits import (
    PriorityHoldback,
    PriorityHoldbackParameters,
    SoftReflectiveCeiling,
)
from epp.scheduling.request import LLMRequest
from tests.support.flowcontrol import MakeFC

_seq = itertools.count()


async def item(tenant: str, at: float, headers: dict[str, str] | None = None,
               size: int = 0) -> QueueItem:
    fut = asyncio.get_running_loop().create_future()
    return QueueItem(FlowControlRequest(request_id=f"{tenant}@{at}", fairness_id=tenant,
                                        headers=headers or {}, byte_size=size),
                     enqueued_at=at, deadline=None, seq=next(_seq), future=fut)


def band(fairness: object) -> Band:
    return Band(PriorityBandConfig(), FCFSOrdering(), fairness)  # type: ignore[arg-type]


# -- priority-holdback-policy ---------------------------------------------------------------


def test_holdback_rank_steps_evenly_from_max_to_min() -> None:
    p = PriorityHoldback("h", PriorityHoldbackParameters(min_ceiling=0.4, max_ceiling=0.9))
    assert p.ceilings(0.0, [100, 5, 0]) == pytest.approx([0.9, 0.65, 0.4])
    assert p.ceilings(0.0, [7]) == [0.9]


def test_holdback_value_scales_by_the_priority_value() -> None:
    p = PriorityHoldback("h", PriorityHoldbackParameters(min_ceiling=0.2, domain="value"))
    assert p.ceilings(0.0, [10, 8, 0]) == pytest.approx([1.0, 0.84, 0.2])
    assert p.ceilings(0.0, [3, 3]) == [1.0, 1.0]


@pytest.mark.parametrize(("params", "message"), [
    ("{}", "minCeiling is required"),
    ("{minCeiling: 1.0}", "minCeiling must be in"),
    ("{minCeiling: 0.5, maxCeiling: 0.5}", "must be less than maxCeiling"),
    ("{minCeiling: 0.5, shape: cubic}", "shape"),
])
def test_holdback_bad_parameters_are_refused(params: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(parse_config(f"plugins:\n- type: priority-holdback-policy\n  parameters: {params}\n"))


async def test_holdback_keeps_low_bands_back_while_higher_ones_go(make_fc: MakeFC) -> None:
    text = ("featureGates: [flowControl]\nplugins:\n- type: priority-holdback-policy\n"
            "  name: hb\n  parameters: {minCeiling: 0.5}\n"
            "flowControl:\n  usageLimitPolicyPluginRef: hb\n"
            "  priorityBands: [{priority: 10}, {priority: -1}]\n")
    fc = build(parse_config(text)).flow_control
    assert fc is not None
    assert list(fc.usage_limit.ceilings(0.6, [10, -1])) == [1.0, 0.5]


# -- soft-reflective-ceiling-policy ---------------------------------------------------------


def test_soft_reflective_opens_everything_under_light_load() -> None:
    assert list(SoftReflectiveCeiling().ceilings(0.2, [3, 2, 1])) == [1.0, 1.0, 1.0]


def test_soft_reflective_alternates_gated_bands_together() -> None:
    p = SoftReflectiveCeiling()
    # s = 0.7, N = 3: band 1's reflective ceiling 0.65, band 2's 0.3: both gated; the period
    # round(0.7 / 0.3) = 2 opens them on every second call, together.
    calls = [list(p.ceilings(0.7, [3, 2, 1])) for _ in range(4)]
    assert calls == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


def test_soft_reflective_closes_all_but_the_top_band_when_saturated() -> None:
    assert list(SoftReflectiveCeiling().ceilings(1.0, [3, 2, 1])) == [1.0, 0.0, 0.0]
    assert list(SoftReflectiveCeiling().ceilings(0.9, [5])) == [1.0]


def test_soft_reflective_takes_no_parameters() -> None:
    with pytest.raises(ConfigError, match="unknown parameters"):
        build(parse_config("plugins:\n- type: soft-reflective-ceiling-policy\n"
                           "  parameters: {x: 1}\n"))


# -- slo-deadline-ordering-policy -----------------------------------------------------------


async def test_slo_deadline_reads_the_v010_header_before_its_old_name() -> None:
    policy = SLODeadlineOrdering()
    new = await item("t", 10.0, {"x-llm-d-slo-ttft-ms": "100"})
    old = await item("t", 10.0, {"x-slo-ttft-ms": "50"})
    both = await item("t", 10.0, {"x-llm-d-slo-ttft-ms": "300", "x-slo-ttft-ms": "1"})
    assert policy.key(new)[0] == pytest.approx(10.1)
    assert policy.key(old)[0] == pytest.approx(10.05)
    assert policy.key(both)[0] == pytest.approx(10.3)


# -- program-aware-fairness -----------------------------------------------------------------


async def test_program_aware_serves_the_least_served_program_first() -> None:
    policy = ProgramAwareFairness()
    b = band(policy)
    b.flow("heavy").push(await item("heavy", 1.0))  # waited longer
    b.flow("light").push(await item("light", 2.0))
    policy.served("heavy", 1000, 500, 0, 1000)  # 1000 + 2 x 500 = 2000 weighted tokens
    policy.served("light", 100, 10, 0, 100)
    assert policy.service("heavy") == 2000
    picked = policy.pick(b)
    assert picked is not None and picked.fairness_id == "light"


async def test_program_aware_breaks_equal_service_by_head_wait() -> None:
    policy = ProgramAwareFairness()
    b = band(policy)
    b.flow("late").push(await item("late", 5.0))
    b.flow("early").push(await item("early", 1.0))
    picked = policy.pick(b)
    assert picked is not None and picked.fairness_id == "early"


async def test_program_aware_decays_idle_programs_by_half_life() -> None:
    policy = ProgramAwareFairness("p", ProgramAwareParameters(las_half_life_seconds=10))
    now = [100.0]
    policy.clock = lambda: now[0]
    policy.served("idle", 1000, 0, 0, 0)
    b = band(policy)
    b.flow("busy").push(await item("busy", 1.0))
    now[0] = 110.0  # one half-life later, nothing waiting or in flight for "idle"
    policy.pick(b)
    assert policy.service("idle") == pytest.approx(500)


async def test_program_aware_forgets_programs_after_the_eviction_ttl() -> None:
    policy = ProgramAwareFairness("p", ProgramAwareParameters(
        eviction_ttl_seconds=60, eviction_sweep_seconds=1))
    now = [0.0]
    policy.clock = lambda: now[0]
    policy.served("gone", 10, 0, 0, 0)
    b = band(policy)
    now[0] = 61.0
    policy.pick(b)
    assert "gone" not in policy.programs


def program_gauge(name: str, program: str | None = None) -> float | None:
    labels = {} if program is None else {"program_id": program}
    return REGISTRY.get_sample_value(f"llm_d_epp_program_aware_{name}", labels)


async def test_program_aware_exports_each_programs_mean_wait_and_jains_index() -> None:
    """v0.10's ``avg_wait_time_milliseconds{program_id}`` (running mean of the queue wait
    of the requests the policy released) and ``jains_fairness_index`` over those means."""
    policy = ProgramAwareFairness()
    b = band(policy)
    now = asyncio.get_running_loop().time()
    a1, a2 = await item("wait-a", now - 0.100), await item("wait-a", now - 0.300)
    b.flow("wait-a").push(a1)
    b.flow("wait-a").push(a2)
    c = await item("wait-c", now - 0.900)
    b.flow("wait-c").push(c)
    released = []
    for _ in range(3):  # the flow controller releases the head of each picked flow
        flow = policy.pick(b)
        assert flow is not None
        head = flow.head()
        assert head is not None
        released.append(head.request.fairness_id)
        flow.remove(head)
    assert sorted(released) == ["wait-a", "wait-a", "wait-c"]
    # whole milliseconds; the loop clock moved a little between the picks
    assert program_gauge("avg_wait_time_milliseconds", "wait-a") == pytest.approx(200, abs=15)
    assert program_gauge("avg_wait_time_milliseconds", "wait-c") == pytest.approx(900, abs=15)
    assert program_gauge("jains_fairness_index") == pytest.approx(
        1100 ** 2 / (2 * (200 ** 2 + 900 ** 2)), abs=0.02)


async def test_program_aware_with_one_waiting_program_is_perfectly_fair() -> None:
    policy = ProgramAwareFairness()
    b = band(policy)
    b.flow("alone").push(await item("alone", asyncio.get_running_loop().time() - 0.5))
    policy.pick(b)
    assert program_gauge("jains_fairness_index") == 1.0


async def test_program_aware_drops_a_forgotten_programs_wait_series() -> None:
    policy = ProgramAwareFairness("p", ProgramAwareParameters(
        eviction_ttl_seconds=60, eviction_sweep_seconds=1))
    now = [0.0]
    policy.clock = lambda: now[0]
    b = band(policy)
    q = await item("short-lived", asyncio.get_running_loop().time() - 0.05)
    b.flow("short-lived").push(q)
    flow = policy.pick(b)
    assert flow is not None
    flow.remove(q)
    b.drop_if_empty(flow)
    assert program_gauge("avg_wait_time_milliseconds", "short-lived") is not None
    now[0] = 61.0
    policy.pick(b)
    assert "short-lived" not in policy.programs
    assert program_gauge("avg_wait_time_milliseconds", "short-lived") is None


def agent_request(headers: dict[str, str]) -> LLMRequest:
    return LLMRequest(request_id="r", target_model="m", headers=headers)


def test_fairness_id_prefers_the_v010_header_then_its_alias() -> None:
    both = {"x-llm-d-inference-fairness-id": "new", "x-gateway-inference-fairness-id": "old"}
    assert fairness_id(agent_request(both)) == "new"
    assert fairness_id(agent_request({"x-gateway-inference-fairness-id": "old"})) == "old"
    assert fairness_id(agent_request({})) == "default-flow"


def test_agent_sessions_feed_the_fairness_id_with_program_aware_fairness() -> None:
    text = ("featureGates: [flowControl]\nplugins:\n- type: program-aware-fairness\n"
            "flowControl:\n  defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}\n")
    [admitter] = build(parse_config(text)).handle.find(FlowControlAdmitter)
    assert admitter.agents
    session = {"x-claude-code-session-id": "claude-1", "session-id": "codex-9"}
    assert admitter._fairness_id(agent_request(session)) == "claude-1"
    assert admitter._fairness_id(agent_request({"session_id": "codex-old"})) == "codex-old"
    explicit = {**session, "x-llm-d-inference-fairness-id": "tenant"}
    assert admitter._fairness_id(agent_request(explicit)) == "tenant"
    [plain] = build(parse_config("featureGates: [flowControl]\n")).handle.find(
        FlowControlAdmitter)
    assert not plain.agents  # without it, session headers do not split flows
    assert plain._fairness_id(agent_request(session)) == "default-flow"


async def test_completed_usage_reaches_the_fairness_policy(make_fc: MakeFC) -> None:
    policy = ProgramAwareFairness("paf")
    fc = make_fc(FlowControlConfig(default_priority_band=PriorityBandConfig(
        fairness_policy_ref="paf")), plugins={"paf": policy})
    fc.started(0, "agent", 40)
    fc.ended(0, "agent", TokenUsage(prompt_tokens=30, completion_tokens=5))
    assert policy.service("agent") == 40


# -- token-fairness-policy (ours) -----------------------------------------------------------


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


async def serve_backlogged(fairness: object, prompts: dict[str, int], n: int,
                           cached: int = 0) -> dict[str, float]:
    """Every tenant always has requests waiting; dispatch ``n`` of them one at a time, each
    ending (with its usage) before the next; tokens served per tenant."""
    b = band(fairness)
    served = dict.fromkeys(prompts, 0.0)
    for t in prompts:
        for k in range(3):
            b.flow(t).push(await item(t, float(k)))
    for i in range(n):
        q = b.fairness.pick(b)  # type: ignore[attr-defined]
        assert q is not None
        t = q.fairness_id
        head = q.head()
        assert head is not None
        q.remove(head)
        q.push(await item(t, 10.0 + i))  # still backlogged
        if isinstance(fairness, TokenFairness):
            fairness.started(t, prompts[t])
            fairness.served(t, prompts[t], 100, cached, prompts[t])
        served[t] += prompts[t] + 2 * 100
    return served


async def test_token_fairness_equalises_tokens_where_request_fairness_does_not() -> None:
    from epp.flowcontrol.policies import RoundRobinFairness
    prompts = {"long": 10_000, "a": 1_000, "b": 1_000}
    by_tokens = await serve_backlogged(TokenFairness(), prompts, 300)
    by_requests = await serve_backlogged(RoundRobinFairness(), prompts, 300)
    assert jain(list(by_tokens.values())) >= 0.95
    total = sum(by_tokens.values())
    assert all(abs(v / total - 1 / 3) <= 0.1 / 3 for v in by_tokens.values())
    share = by_requests["long"] / sum(by_requests.values())
    assert share > 2 / 3  # > 2x its equal share under request-count fairness


def test_token_fairness_cost_weighs_output_and_discounts_cache() -> None:
    p = TokenFairness()
    assert p.cost(1000, 100) == 1000 + 200
    assert p.cost(1000, 100, cached_tokens=800) == pytest.approx(200 + 80 + 200)


async def test_token_fairness_lifts_a_returning_tenant_to_the_busy_floor() -> None:
    p = TokenFairness()
    b = band(p)
    p.counters.update({"busy1": 5000.0, "busy2": 7000.0})
    for t in ("busy1", "busy2"):
        b.flow(t).push(await item(t, 1.0))
    p.pick(b)
    b.flow("new").push(await item("new", 2.0))  # was idle: no banked credit
    p.pick(b)
    assert p.counters["new"] == 5000.0


async def test_token_fairness_charges_the_estimate_then_the_exact_usage() -> None:
    p = TokenFairness()
    p.started("t", 500)
    assert p.counters["t"] == 500
    p.served("t", 400, 10, 0, 500)
    assert p.counters["t"] == pytest.approx(400 + 20)
    p.served("t", 0, 0, 0, 500)  # no usage: the estimate stays
    assert p.counters["t"] == pytest.approx(420)




# -- upstream v0.10's shipped flow-control configs (deploy/config), as our test data ---------


def test_upstream_program_aware_config_puts_programs_in_las_bands(make_fc: MakeFC) -> None:
    text = ("plugins:\n- type: program-aware-fairness\n- type: queue-scorer\n"
            "- type: max-score-picker\n- type: single-profile-handler\n"
            "featureGates: [flowControl]\n"
            "flowControl:\n  defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}\n")
    runtime = build(parse_config(text))
    assert runtime.flow_control is not None
    [configured] = runtime.handle.find(ProgramAwareFairness)
    assert runtime.flow_control._band(0).fairness is configured


def test_upstream_soft_reflective_config_uses_it_as_the_usage_limit() -> None:
    text = ("featureGates: [flowControl]\nplugins:\n- type: soft-reflective-ceiling-policy\n"
            "flowControl: {usageLimitPolicyPluginRef: soft-reflective-ceiling-policy}\n")
    fc = build(parse_config(text)).flow_control
    assert fc is not None and isinstance(fc.usage_limit, SoftReflectiveCeiling)


def test_flow_control_saturation_detector_wins_over_the_top_level_one() -> None:
    text = ("featureGates: [flowControl]\nplugins:\n"
            "- {type: utilization-detector, name: a}\n"
            "- {type: concurrency-detector, name: b}\n"
            "saturationDetector: {pluginRef: a}\n"
            "flowControl: {saturationDetector: {pluginRef: b}}\n")
    runtime = build(parse_config(text))
    assert runtime.saturation.name == "b"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"flowControl\.saturationDetector\.pluginRef"):
        parse_config("flowControl: {saturationDetector: {pluginRef: nope}}\n")
