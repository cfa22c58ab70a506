"""Flow-control metrics: exactly upstream v1.5's names, types and label names, with values
that follow the queues."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from epp.flowcontrol import FlowControlConfig, FlowControlRequest, Outcome
from tests.support.fchelpers import Gate, release
from tests.support.flowcontrol import MakeFC

FLOW = {"fairness_id", "priority", "inference_pool", "model_name", "target_model_name"}
# name → (type, label names), from upstream v1.5.0 pkg/epp/metrics/metrics.go.
UPSTREAM = {
    "inference_extension_flow_control_request_queue_duration_seconds":
        ("histogram", FLOW | {"outcome"}),
    "inference_extension_flow_control_dispatch_cycle_duration_seconds": ("histogram", set()),
    "inference_extension_flow_control_request_enqueue_duration_seconds":
        ("histogram", {"fairness_id", "priority", "outcome"}),
    "inference_extension_flow_control_queue_size": ("gauge", FLOW),
    "inference_extension_flow_control_queue_bytes": ("gauge", FLOW),
    "inference_extension_flow_control_pool_saturation": ("gauge", {"inference_pool"}),
}
# llm-d-router v0.10 exports each under its new name too, and counts final outcomes.
UPSTREAM |= {k.replace("inference_extension_", "llm_d_epp_"): v for k, v in UPSTREAM.items()}
UPSTREAM["llm_d_epp_flow_control_requests"] = ("counter",
                                               {"outcome", "priority", "inference_pool"})


def families(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    out: dict[str, tuple[str, set[str]]] = {}
    for fam in registry.collect():
        labels: set[str] = set()
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
        out[fam.name] = (fam.type, labels)
    return out


def r(rid: str, **kw: object) -> FlowControlRequest:
    return FlowControlRequest(request_id=rid, fairness_id="tenant-a", priority=2, byte_size=50,
                              model_name="m", target_model_name="m-lora", **kw)  # type: ignore[arg-type]


async def test_series_have_upstream_names_types_and_labels(make_fc: MakeFC, gate: Gate,
                                                           registry: CollectorRegistry) -> None:
    fc = make_fc()
    gate.value = 0.0
    assert await fc.enqueue_and_wait(r("fast")) is Outcome.DISPATCHED
    gate.value = 1.0
    task = asyncio.create_task(fc.enqueue_and_wait(r("a")))
    for _ in range(20):
        await asyncio.sleep(0)
    assert fc.length == 1
    got = families(registry)  # one request finished and one queued: every series has samples
    assert got == UPSTREAM
    release(fc, gate)
    assert await task is Outcome.DISPATCHED


async def test_values_follow_the_queue(make_fc: MakeFC, gate: Gate,
                                       registry: CollectorRegistry) -> None:
    fc = make_fc()
    flow = {"fairness_id": "tenant-a", "priority": "2", "inference_pool": "pool-a",
            "model_name": "m", "target_model_name": "m-lora"}
    tasks = [asyncio.create_task(fc.enqueue_and_wait(r(f"x{i}"))) for i in range(3)]
    for _ in range(20):
        await asyncio.sleep(0)
    size = "inference_extension_flow_control_queue_size"
    nbytes = "inference_extension_flow_control_queue_bytes"
    assert registry.get_sample_value(size, flow) == 3
    assert registry.get_sample_value(nbytes, flow) == 150
    assert registry.get_sample_value("inference_extension_flow_control_pool_saturation",
                                     {"inference_pool": "pool-a"}) == 1.0
    release(fc, gate)
    assert registry.get_sample_value(size, flow) == 2
    assert registry.get_sample_value(nbytes, flow) == 100
    release(fc, gate, 2)
    await asyncio.gather(*tasks)
    assert registry.get_sample_value(size, flow) is None  # the empty flow's series is removed
    dispatched = {**flow, "outcome": "Dispatched"}
    assert registry.get_sample_value(
        "inference_extension_flow_control_request_queue_duration_seconds_count",
        dispatched) == 3
    assert registry.get_sample_value(
        "inference_extension_flow_control_request_enqueue_duration_seconds_count",
        {"fairness_id": "tenant-a", "priority": "2", "outcome": "NotYetFinalized"}) == 3
    cycles = registry.get_sample_value(
        "inference_extension_flow_control_dispatch_cycle_duration_seconds_count", {})
    assert cycles is not None and cycles >= 3


async def test_fast_path_and_rejections_are_recorded_with_their_outcome(
        make_fc: MakeFC, gate: Gate, registry: CollectorRegistry) -> None:
    fc = make_fc(FlowControlConfig(max_requests=1))
    gate.value = 0.0
    assert await fc.enqueue_and_wait(r("fast")) is Outcome.DISPATCHED
    gate.value = 1.0
    t = asyncio.create_task(fc.enqueue_and_wait(r("q")))
    for _ in range(20):
        await asyncio.sleep(0)
    assert await fc.enqueue_and_wait(r("full")) is Outcome.REJECTED_CAPACITY
    for outcome in ("Dispatched", "RejectedCapacity"):
        assert registry.get_sample_value(
            "inference_extension_flow_control_request_enqueue_duration_seconds_count",
            {"fairness_id": "tenant-a", "priority": "2", "outcome": outcome}) == 1
    t.cancel()
