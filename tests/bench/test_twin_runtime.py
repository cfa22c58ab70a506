"""The twin's runtime engine runs the EPP's real flow controller on a virtual clock: priority
bands let a later interactive request overtake queued batch requests, the deadline ordering
does the same from the SLO header alone, and FIFO does not; a run is the same every time; a
twin that deadlocks fails at once instead of hanging; the latency producer's in-stream
predictions reach what it reports."""

from __future__ import annotations

import asyncio

import looptime
import pytest

from bench.scenario import SCENARIOS
from bench.twin.runtime import Done, Twin
from bench.twin.vtime import run_in_virtual_time
from bench.workloads import OBJECTIVE_HEADER, WORKLOADS

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


def _queue_up(config: str, interactive: dict[str, str]) -> Twin:
    """Six batch requests at t=0, then one interactive request (``interactive`` headers)
    at t=0.1 s, while the first batch request still runs."""
    twin = Twin(config, seed=3, fleet=1)
    body = {"model": "m", "prompt": "word " * 400, "max_tokens": 20}
    for i in range(6):
        twin.add(0.001 * i, body, {}, f"batch-{i}")
    twin.add(0.1, body, interactive, "interactive")
    twin.run()
    return twin


def _finish_order(twin: Twin) -> list[str]:
    return [d.tag for d in sorted(twin.done, key=lambda d: d.finish)]


def test_a_higher_priority_request_overtakes_the_queued_batch() -> None:
    twin = _queue_up(ONE_AT_A_TIME, {OBJECTIVE_HEADER: "interactive"})
    assert twin.runtime.flow_control is not None
    assert twin.refused == 0 and len(twin.done) == 7
    # batch-0 was running when it arrived; it goes next, before the five that waited.
    assert _finish_order(twin)[:2] == ["batch-0", "interactive"]
    assert twin.now > 1.5  # seconds of model time passed; nothing slept


def test_the_slo_deadline_ordering_overtakes_within_one_band() -> None:
    twin = _queue_up(DEADLINE, {"x-slo-ttft-ms": "400"})
    assert _finish_order(twin)[:2] == ["batch-0", "interactive"]


def test_without_priority_or_deadline_the_queue_is_first_come_first_served() -> None:
    twin = _queue_up(ONE_AT_A_TIME, {"x-slo-ttft-ms": "400"})
    assert _finish_order(twin) == [f"batch-{i}" for i in range(6)] + ["interactive"]


def test_the_virtual_time_twin_is_deterministic() -> None:
    def outcome() -> list[tuple[str, float]]:
        twin = _queue_up(ONE_AT_A_TIME, {OBJECTIVE_HEADER: "interactive"})
        return [(d.tag, d.ttft) for d in twin.done]
    assert outcome() == outcome()


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


def _predicted(config: str) -> list[Done]:
    """40 s of the ShareGPT-like mix at 0.7 on 4 servers, seed 1, the default profile
    scheduling and ``config``'s producer predicting."""
    twin = Twin(config, seed=1)
    for spec in WORKLOADS["sharegpt"].schedule(0.7, 40.0, 1, 4):
        twin.add(spec.at, spec.body, dict(spec.headers), spec.tag)
    twin.run()
    return sorted(twin.done, key=lambda d: d.arrival)


def test_in_stream_samples_change_the_reported_tpot_not_the_picks() -> None:
    """With upstream's maxDecodeTokenSamplesForPrediction the producer predicts again while
    the request decodes (the twin streams a chunk per token), so what it reports differs
    from the pick's prediction; without it the report is the pick's prediction."""
    config = (SCENARIOS / "configs" / "predict-only.yaml").read_text()
    assert "{streamingMode: true}" in config
    plain = _predicted(config)
    sampled = _predicted(config.replace("{streamingMode: true}", (
        "{streamingMode: true, maxDecodeTokenSamplesForPrediction: 20, samplingMean: 5}")))
    assert plain and all(d.reported_tpot == d.predicted_tpot for d in plain)
    assert [d.predicted_tpot for d in sampled] == [d.predicted_tpot for d in plain]
    changed = [d for d in sampled if d.reported_tpot != d.predicted_tpot]
    assert len(changed) > len(sampled) // 2


def test_a_run_of_upstreams_latency_profile_is_the_same_every_time() -> None:
    """Every plugin that draws (here the SLO tier filter's exploration of the tier without
    headroom) takes the runtime's seeded random source, so a seed is one run: 60 s of the
    slo-tiers scenario (fast and slow servers, mixed SLOs)."""
    from bench.scenario import load_scenario
    from sim.profiles import get_profile

    scn = load_scenario(SCENARIOS / "slo-tiers.yaml")
    fleet = scn.fleet
    specs = scn.workload.schedule(0.8, 60.0, 100, fleet.capacity_servers)
    config = (SCENARIOS / "configs" / "slo-p90.yaml").read_text()

    def outcome() -> list[tuple[float, int, float]]:
        twin = Twin(config, 100, fleet.servers, get_profile(fleet.profile), fleet.speeds)
        for spec in specs:
            twin.add(spec.at, spec.body, dict(spec.headers), spec.tag)
        twin.run()
        return sorted((d.arrival, d.engine, d.ttft) for d in twin.done)
    first = outcome()
    assert first and outcome() == first


def test_the_runtime_twin_reports_how_each_class_spread_over_the_pods() -> None:
    """Its outcomes carry their prompt tokens and pod, so the per-class spread over pods is
    measured (it read 0.000 for every contender while they carried no prompt tokens): on
    slo-tiers' fast and slow pods the classes' prompt tokens do not spread evenly."""
    from bench.runner import _Job, _virtual, plan
    from bench.scenario import load_scenario

    p = plan(load_scenario(SCENARIOS / "slo-tiers.yaml"), seeds=[0], duration=15.0,
             contenders=["epp-default", "slo-p90"])
    for res in _virtual(_Job(p, 0.8, 0)):
        assert res.classes and all(c["pod_cv"] > 0 for c in res.classes.values()), res
