"""The SLO twin runs the EPP's real flow controller on a virtual clock: priority bands let a
later interactive request overtake queued batch requests, the deadline ordering does the
same from the SLO header alone, and FIFO does not; a run is the same every time; a twin that
deadlocks fails at once instead of hanging."""

from __future__ import annotations

import asyncio

import looptime
import pytest

from bench import slo_twin
from bench.slo_twin import Twin
from bench.twin.vtime import run_in_virtual_time
from bench.workloads import OBJECTIVE_HEADER

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


def test_tpot_is_explained_by_the_prefills_that_reach_the_engine_after_the_pick() -> None:
    """The diagnostic behind the TPOT row: knowing the later prefills beats any constant."""
    _ttft, tpot, constant, post_pick, *model_warm, reported = slo_twin.prediction_error(
        "sharegpt", 1, 40.0)
    assert post_pick < constant / 3
    # The MAPEs after the model's own warm-up (the first 30% of its predictions) are there.
    assert len(model_warm) == 2 and all(0 < v < 100 for v in model_warm)
    # Without in-stream samples the reported TPOT is the pick's prediction.
    assert reported == pytest.approx(tpot)


def test_in_stream_samples_change_the_reported_tpot_not_the_picks() -> None:
    """With upstream's maxDecodeTokenSamplesForPrediction the producer predicts again while
    the request decodes (the twin streams a chunk per token), so what it reports differs
    from the pick's prediction."""
    _ttft, tpot, *_, reported = slo_twin.prediction_error(
        "sharegpt", 1, 40.0, slo_twin.sampled_config(20, 5))
    plain = slo_twin.prediction_error("sharegpt", 1, 40.0)
    assert tpot == pytest.approx(plain[1])  # the picks' predictions are unchanged
    assert 0 < reported < 100 and reported != pytest.approx(tpot)
