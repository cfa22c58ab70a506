"""The twin plays an EPP whose admitters may wait on a virtual-time event loop: the real flow
controller's priority bands let a later interactive request overtake queued batch requests,
the deadline ordering does the same from the SLO header alone, and FIFO does not; a run is
the same every time; a twin that deadlocks fails at once instead of hanging; the latency
producer's in-stream predictions reach what it reports."""

from __future__ import annotations

import asyncio

import looptime
import pytest

from bench.scenario import SCENARIOS
from bench.twin.epp_adapter import EppRouter
from bench.twin.loop import TwinConfig, TwinOutcome, run, run_in_virtual_time
from bench.workloads import MODEL, OBJECTIVE_HEADER, WORKLOADS, RequestSpec

#: One engine that holds one request at a time: everything else waits in the EPP's queues.
ONE_AT_A_TIME = """\
featureGates: [flowControl]
plugins:
- {type: queue-scorer}
- {type: concurrency-detector, parameters: {maxConcurrency: 1}}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: concurrency-detector}
  - {pluginRef: queue-scorer}
saturationDetector: {pluginRef: concurrency-detector}
"""
DEADLINE = ONE_AT_A_TIME + """\
flowControl:
  defaultPriorityBand: {orderingPolicyRef: slo-deadline-ordering-policy}
"""


def _play(config: str, specs: list[RequestSpec], seed: int, servers: int = 1,
          **fleet: object) -> tuple[EppRouter, list[TwinOutcome]]:
    cfg = TwinConfig(servers=servers, seed=seed, model=MODEL, **fleet)  # type: ignore[arg-type]
    router = EppRouter("epp", cfg.keys(), seed, config_text=config, model=MODEL)
    return router, run(specs, router, cfg)


def _queue_up(config: str, interactive: dict[str, str]) -> tuple[EppRouter, list[str]]:
    """Six batch requests at t=0, then one interactive request (``interactive`` headers)
    at t=0.1 s, while the first batch request still runs; the tags in finish order."""
    body = {"model": MODEL, "prompt": "word " * 400, "max_tokens": 20}
    specs = [RequestSpec(0.001 * i, "/v1/completions", body, f"batch-{i}") for i in range(6)]
    specs.append(RequestSpec(0.1, "/v1/completions", body, "interactive", interactive))
    router, outcomes = _play(config, specs, seed=3)
    assert all(o.ok for o in outcomes) and len(outcomes) == 7
    assert max(o.start + (o.e2e or 0) for o in outcomes) > 1.5   # model time; nothing slept
    finished = sorted(outcomes, key=lambda o: o.start + (o.e2e or 0))
    return router, [specs[o.index].tag for o in finished]


def test_a_higher_priority_request_overtakes_the_queued_batch() -> None:
    router, order = _queue_up(ONE_AT_A_TIME, {OBJECTIVE_HEADER: "interactive"})
    assert router.runtime.flow_control is not None
    # batch-0 was running when it arrived; it goes next, before the five that waited.
    assert order[:2] == ["batch-0", "interactive"]


def test_the_slo_deadline_ordering_overtakes_within_one_band() -> None:
    _, order = _queue_up(DEADLINE, {"x-slo-ttft-ms": "400"})
    assert order[:2] == ["batch-0", "interactive"]


def test_without_priority_or_deadline_the_queue_is_first_come_first_served() -> None:
    _, order = _queue_up(ONE_AT_A_TIME, {"x-slo-ttft-ms": "400"})
    assert order == [f"batch-{i}" for i in range(6)] + ["interactive"]


def test_the_virtual_time_twin_is_deterministic() -> None:
    def outcome() -> list[TwinOutcome]:
        return _play(ONE_AT_A_TIME, WORKLOADS["sharegpt"].schedule(0.9, 10.0, 1, 2), 1, 2)[1]
    first = outcome()
    assert any(o.ttft for o in first) and outcome() == first


def test_virtual_time_jumps_to_the_next_timer() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600.0)
        async with asyncio.timeout(5.0):
            await asyncio.sleep(1.0)
        return loop.time()
    assert run_in_virtual_time(main()) == pytest.approx(3601.0)


def test_a_deadlocked_twin_fails_instead_of_hanging() -> None:
    async def main() -> None:
        await asyncio.Event().wait()  # nothing will ever set it, and no timer is pending
    with pytest.raises(looptime.IdleTimeoutError):
        run_in_virtual_time(main())


def _predicted(config: str) -> list[TwinOutcome]:
    """40 s of the ShareGPT-like mix at 0.7 on 4 servers, seed 1, the default profile
    scheduling and ``config``'s producer predicting."""
    return _play(config, WORKLOADS["sharegpt"].schedule(0.7, 40.0, 1, 4), 1, 4)[1]


def test_in_stream_samples_change_the_reported_tpot_not_the_picks() -> None:
    """With upstream's maxDecodeTokenSamplesForPrediction the producer predicts again while
    the request decodes (the twin streams a chunk per token), so what it reports differs
    from the pick's prediction; without it the report is the pick's prediction."""
    config = (SCENARIOS / "configs" / "predict-only.yaml").read_text()
    assert "{streamingMode: true}" in config
    plain = _predicted(config)
    sampled = _predicted(config.replace("{streamingMode: true}", (
        "{streamingMode: true, maxDecodeTokenSamplesForPrediction: 20, samplingMean: 5}")))
    assert plain and all(o.reported_tpot == o.predicted_tpot for o in plain)
    assert [o.predicted_tpot for o in sampled] == [o.predicted_tpot for o in plain]
    changed = [o for o in sampled if o.reported_tpot != o.predicted_tpot]
    assert len(changed) > len(sampled) // 2


def test_a_run_of_upstreams_latency_profile_is_the_same_every_time() -> None:
    """Every plugin that draws (here the SLO tier filter's exploration of the tier without
    headroom) takes the runtime's seeded random source, so a seed is one run: 60 s of the
    slo-tiers scenario (fast and slow servers, mixed SLOs)."""
    from bench.scenario import load_scenario

    scn = load_scenario(SCENARIOS / "slo-tiers.yaml")
    fleet = scn.fleet
    specs = scn.workload.schedule(0.8, 60.0, 100, fleet.capacity_servers)
    config = (SCENARIOS / "configs" / "slo-p90.yaml").read_text()

    def outcome() -> list[TwinOutcome]:
        return _play(config, specs, 100, fleet.servers, profile=fleet.profile,
                     speeds=fleet.speeds)[1]
    first = outcome()
    assert any(o.predicted_tpot for o in first) and outcome() == first


def test_the_twin_reports_how_each_class_spread_over_the_pods() -> None:
    """Its outcomes carry their prompt tokens and pod, so the per-class spread over pods is
    measured (it read 0.000 for every contender while they carried no prompt tokens): on
    slo-tiers' fast and slow pods the classes' prompt tokens do not spread evenly."""
    from bench.runner import _Job, _virtual, plan
    from bench.scenario import load_scenario

    p = plan(load_scenario(SCENARIOS / "slo-tiers.yaml"), seeds=[0], duration=15.0,
             contenders=["epp-default", "slo-p90"])
    for res in _virtual(_Job(p, 0.8, 0)):
        assert res.classes and all(c["pod_cv"] > 0 for c in res.classes.values()), res
