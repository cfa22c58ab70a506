"""The flow-control benchmarks' own arithmetic: goodput within the flood window, Jain's index
over max-min fair shares, the priority mix's schedules, the EPP queue summary, and that the
priority bench's manifests load."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from bench.contenders import pool_manifests
from bench.flowcontrol_noisy import jain_of_shares, max_min_shares, tokens_within
from bench.flowcontrol_noisy_twin import CONFIGS, NOISY_HEADERS, run
from bench.flowcontrol_priority import OBJECTIVES, PriorityMix
from bench.flowcontrol_probe import queue_summary
from bench.openloop import Outcome
from bench.workloads import RequestSpec
from epp.config import build, parse_config
from epp.flowcontrol import FlowControlMetrics
from epp.sources.manifests import load_snapshot


def spec(tag: str, at: float, max_tokens: int) -> RequestSpec:
    return RequestSpec(at, "/v1/completions", {"max_tokens": max_tokens}, tag=tag)


def test_tokens_count_when_they_reach_the_client_within_the_window() -> None:
    specs = [spec("a", 0.0, 4), spec("b", 1.0, 3), spec("b", 9.5, 2), spec("c", 11.0, 5)]
    outcomes = [
        Outcome(0, start=0.0, status=200, ttft=1.0, itl=[1.0, 1.0, 1.0]),  # tokens at 1,2,3,4
        Outcome(1, start=1.0, status=200, ttft=5.0, itl=[3.0, 3.0]),       # at 6, 9, 12
        Outcome(2, start=9.5, status=429),                                  # none
        Outcome(3, start=11.0, status=200, ttft=0.1, itl=[0.1] * 4),        # after the window
    ]
    got, asked = tokens_within(specs, outcomes, 1.0, 10.0)
    assert got == {"a": 4, "b": 2, "c": 0}
    assert asked == {"a": 4, "b": 5}  # c arrived after the window


def test_max_min_shares_fill_small_demands_first() -> None:
    assert max_min_shares({"q": 1.0, "n": 10.0}, 6.0) == {"q": 1.0, "n": 5.0}
    assert max_min_shares({"q": 4.0, "n": 10.0}, 6.0) == {"q": 3.0, "n": 3.0}


def test_jain_is_one_at_the_fair_shares_and_low_when_one_tenant_takes_them() -> None:
    demand = {"q1": 10.0, "q2": 10.0, "q3": 10.0, "noisy": 100.0}
    fair = {"q1": 10.0, "q2": 10.0, "q3": 10.0, "noisy": 70.0}
    assert jain_of_shares(fair, demand) == pytest.approx(1.0)
    hog = {"q1": 2.0, "q2": 2.0, "q3": 2.0, "noisy": 94.0}
    assert jain_of_shares(hog, demand) < 0.6
    assert jain_of_shares({}, demand) != jain_of_shares({}, demand)  # NaN: nothing delivered


def test_priority_mix_keeps_the_critical_schedule_under_the_flood() -> None:
    idle = PriorityMix("idle", 0.3, 0.0).schedule(1.0, 10.0, seed=3)
    flood = PriorityMix("flood", 0.3, 2.0).schedule(1.0, 10.0, seed=3)
    crit = [s for s in flood if s.tag == "critical"]
    assert [(s.at, s.body) for s in crit] == [(s.at, s.body) for s in idle]
    assert {s.tag for s in idle} == {"critical"}
    assert len(flood) > 5 * len(idle)
    assert all(s.headers == {"x-gateway-inference-objective": s.tag} for s in flood)


def test_queue_summary_reads_the_epps_queue_duration_histogram() -> None:
    registry = CollectorRegistry()
    m = FlowControlMetrics(registry)
    for waited in (0.0, 0.0, 0.5):
        m.outcome(("t1", "0", "Dispatched", "pool", "m", "m"), waited)
    m.outcome(("t1", "0", "RejectedCapacity", "pool", "m", "m"), 0.0)
    m.outcome(("t2", "-1", "Dispatched", "pool", "m", "m"), 2.0)
    summary = queue_summary(generate_latest(registry).decode())
    assert summary["0/t1"] == {"count": 4, "Dispatched": 3, "RejectedCapacity": 1,
                               "waited": 1, "mean_wait_s": 0.125}
    assert summary["-1/t2"]["waited"] == 1 and summary["-1/t2"]["mean_wait_s"] == 2.0


def test_burst_bound_orders_a_burst_as_each_policy_says() -> None:
    from bench.flowcontrol_burst_bound import global_queue, prefill, round_robin

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


def test_the_priority_bench_manifests_load_with_every_pools_objectives(tmp_path: Path) -> None:
    # Every benchmark pool declares bench.workloads.OBJECTIVES; the priority bench adds
    # `critical`. An objective declared twice would stop the EPP at start.
    fleet = SimpleNamespace(hosts=["127.0.0.1", "127.0.0.2"], port=8000)
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump_all(pool_manifests("sims", fleet) + OBJECTIVES))  # type: ignore[arg-type]
    snapshot = load_snapshot(path, pool_name="sims", pool_namespace="default")
    priorities = {name: o.priority for name, o in snapshot.objectives.items()}
    assert priorities["critical"] == 1 and priorities["sheddable"] == -1


def test_ceiling_model_answers_every_critical_request_and_keeps_sheddable_ones_running() -> None:
    from bench.flowcontrol_ceiling_model import run

    idle, idle_rate = run(0, 0.3, 20.0, seed=0, servers=2)
    busy, busy_rate = run(3, 0.3, 20.0, seed=0, servers=2)
    assert idle_rate == 0.0 and busy_rate > 0.5  # 3 in flight per server, each ~2-4 s
    assert len(idle) == len(busy) > 0            # same critical schedule, all answered
    # Sharing steps with sheddable prefills slows critical first tokens (deterministic here).
    assert sorted(busy)[len(busy) // 2] >= sorted(idle)[len(idle) // 2]


def test_noisy_twin_prefill_configs_carry_the_limit_to_the_detector() -> None:
    for name, limit in (("least-c12-p1", 1), ("least-c8-p2", 2), ("least-c8", None)):
        runtime = build(parse_config(CONFIGS[name]))
        assert runtime.flow_control is not None
        assert runtime.saturation.params.max_prefill_concurrency == limit  # type: ignore[attr-defined]


def test_noisy_twin_reserve_puts_the_named_tenant_in_the_capped_band() -> None:
    """Virtual time, two servers: with the noisy tenant's requests in the sheddable band
    (capped at 0.75 saturation) the quiet tenants find a free slot; without the header
    they wait behind it in one band."""
    name = "least-c8-reserve0.75"
    named = run(CONFIGS[name], 0, True, 2, NOISY_HEADERS[name])
    unnamed = run(CONFIGS[name], 0, True, 2)
    assert named["epp_mean_s"] < unnamed["epp_mean_s"] / 5
