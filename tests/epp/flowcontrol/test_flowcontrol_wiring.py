"""The ``flowControl`` feature gate: off by default (nothing changes), on → the controller
sits at the director's admission point with the pool's saturation detector as its signal."""

from __future__ import annotations

import asyncio
import random
import time

import orjson
import pytest

from devkit.manifests import pool_manifests
from epp.config import ConfigError, build, parse_config
from epp.datastore import Datastore, EndpointMetrics
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.flowcontrol import FlowController, FlowControlUnavailable
from epp.flowcontrol.admitter import FlowControlAdmitter
from epp.requestcontrol import Director, Pending, Routed
from shared.errors import TooManyRequests

X = "inference.networking.x-k8s.io/v1alpha2"
BATCH = {"apiVersion": X, "kind": "InferenceObjective", "metadata": {"name": "batch"},
         "spec": {"poolRef": {"name": "pool"}, "priority": -1}}
HEADERS = {":path": "/v1/completions", "x-request-id": "r1",
           "x-gateway-inference-objective": "batch", "x-gateway-inference-fairness-id": "t1"}
BODY = orjson.dumps({"model": "m", "prompt": "hello"})


def store(waiting: int) -> Datastore:
    docs = pool_manifests("pool", [("pod-0", "10.1.0.1")], 8000, [BATCH])
    ds = Datastore()
    ds.replace(build_snapshot([o for d in docs if (o := parse_object(d)) is not None],
                              pool_name="pool", pool_namespace="default"))
    for view in ds.views():
        view.begin_scrape()
        ds.record_scrape(view, EndpointMetrics(waiting=waiting, running=0, kv_usage=0.0,
                                               updated_at=time.monotonic() + 3600))
    return ds


def director(text: str, waiting: int = 0) -> Director:
    return Director.of(build(parse_config(text), store(waiting), rng=random.Random(0)))


def test_off_by_default_even_with_a_flow_control_section() -> None:
    d = director("flowControl: {maxRequests: 5}\n", waiting=10)
    assert d.runtime.flow_control is None
    assert not [a for a in d.runtime.admitters if isinstance(a, FlowControlAdmitter)]
    # the legacy behaviour stays: a sheddable request on a saturated pool is shed
    with pytest.raises(TooManyRequests, match="saturated"):
        d.prepare(HEADERS, BODY, {})


def picks_and_headers(text: str) -> list[tuple[object, ...]]:
    """Route 60 requests (varied prompts, objectives and tenants) through a director built
    from ``text`` over four endpoints with different loads; every decision, in order."""
    docs = pool_manifests("pool", [(f"pod-{i}", f"10.1.0.{i + 1}") for i in range(4)], 8000,
                          [BATCH])
    ds = Datastore()
    ds.replace(build_snapshot([o for d in docs if (o := parse_object(d)) is not None],
                              pool_name="pool", pool_namespace="default"))
    for i, view in enumerate(ds.views()):
        view.begin_scrape()
        ds.record_scrape(view, EndpointMetrics(waiting=i % 3, running=i, kv_usage=0.2 * i,
                                               updated_at=time.monotonic() + 3600))
    d = Director.of(build(parse_config(text), ds, rng=random.Random(7)))
    out: list[tuple[object, ...]] = []
    for n in range(60):
        headers = {":path": "/v1/completions", "x-request-id": f"r{n}",
                   "x-gateway-inference-fairness-id": f"t{n % 3}",
                   "x-gateway-destination-endpoint": "10.9.9.9:1"}  # a client's spoof
        if n % 4 == 0:
            headers["x-gateway-inference-objective"] = "batch"
        body = orjson.dumps({"model": "m", "prompt": f"shared prefix {n % 5} " * (n % 7 + 1)})
        decision, routed = d.route(headers, body, {})
        out.append((decision.set_headers, sorted(decision.remove_headers), decision.body,
                    decision.metadata))
        d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
                 completion_tokens=1)
    return out


def test_a_flow_control_section_without_the_gate_changes_no_pick_or_header() -> None:
    base = "plugins:\n- type: utilization-detector\n  parameters: {queueDepthThreshold: 2}\n"
    section = ("flowControl:\n  maxRequests: 5\n  defaultRequestTTL: 1s\n"
               "  priorityBands: [{priority: -1, maxRequests: 1}]\n")
    before = picks_and_headers(base)
    assert len({str(p[0]) for p in before}) > 1  # the picks do vary with the load
    assert picks_and_headers(base + section) == before


def test_section_is_validated_without_the_gate() -> None:
    with pytest.raises(ConfigError, match=r"flowControl\.maxRequests: must be non-negative"):
        parse_config("flowControl: {maxRequests: -5}\n")


def test_gate_builds_controller_and_admitter_with_upstream_defaults() -> None:
    runtime = director("featureGates: [flowControl]\n").runtime
    fc = runtime.flow_control
    assert isinstance(fc, FlowController)
    assert fc.config.default_request_ttl == 60 and fc.config.max_requests == 0
    assert fc.config.band(0).effective_max_requests == 5000
    [admitter] = [a for a in runtime.admitters if isinstance(a, FlowControlAdmitter)]
    assert admitter.controller is fc
    assert admitter in runtime.response_complete  # a finished response wakes the dispatcher


def test_bad_policy_ref_names_the_path() -> None:
    text = ("featureGates: [flowControl]\nflowControl:\n"
            "  priorityBands: [{priority: 1, orderingPolicyRef: lifo}]\n")
    with pytest.raises(ConfigError, match=r"cfg: flowControl\.priorityBands\[0\]"
                                          r"\.orderingPolicyRef: no plugin named 'lifo'"):
        build(parse_config(text, source="cfg"))


async def test_sheddable_request_waits_instead_of_being_shed_then_goes_when_room() -> None:
    d = director("featureGates: [flowControl]\n", waiting=10)  # saturated
    fc = d.runtime.flow_control
    assert fc is not None
    pending = d.prepare(HEADERS, BODY, {})  # no 429 from the legacy shed
    admitted = asyncio.create_task(d.admit(pending))
    for _ in range(20):
        await asyncio.sleep(0)
    snap = fc.snapshot()
    assert snap["queued"] == 1
    assert snap["bands"][0]["priority"] == -1 and list(snap["bands"][0]["flows"]) == ["t1"]
    view = d.datastore.views()[0]
    view.begin_scrape()
    d.datastore.record_scrape(view, EndpointMetrics(waiting=0, running=0, kv_usage=0.0,
                                                    updated_at=time.monotonic() + 3600))
    fc.notify()
    await admitted
    decision, routed = d.dispatch(pending)
    assert decision.set_headers["x-gateway-destination-endpoint"] == "10.1.0.1:8000"
    d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=1)
    await fc.aclose()


async def test_refusal_reaches_the_client_as_the_controllers_error() -> None:
    d = director("featureGates: [flowControl]\nflowControl:\n"
                 "  defaultPriorityBand: {maxRequests: 1}\n", waiting=10)
    fc = d.runtime.flow_control
    assert fc is not None
    first = asyncio.create_task(d.admit(d.prepare(HEADERS, BODY, {})))
    for _ in range(20):
        await asyncio.sleep(0)
    with pytest.raises(TooManyRequests) as e:
        await d.admit(d.prepare(HEADERS, BODY, {}))
    assert e.value.code == "flow_control_queue_full"
    await fc.aclose()  # the queued one is evicted: 503
    with pytest.raises(FlowControlUnavailable) as e2:
        await first
    assert e2.value.status == 503
    assert fc.snapshot()["queued"] == 0


async def test_concurrency_detector_releases_a_waiting_request_when_one_finishes() -> None:
    """Dispatching on upstream's concurrency-detector (in-flight requests per endpoint, the
    signal docs/flow-control.md recommends when the engine's own queue stays empty): the
    endpoint's one slot is taken at the pick, so the next request waits in the EPP although
    the scraped queue is empty, and goes as soon as the first response completes."""
    d = director("featureGates: [flowControl]\n"
                 "plugins:\n- type: concurrency-detector\n  parameters: {maxConcurrency: 1}\n"
                 "saturationDetector: {pluginRef: concurrency-detector}\n", waiting=0)
    fc = d.runtime.flow_control
    assert fc is not None
    first = d.prepare({**HEADERS, "x-request-id": "r1"}, BODY, {})
    await d.admit(first)  # fast path: the pool is empty
    _, routed = d.dispatch(first)
    second = d.prepare({**HEADERS, "x-request-id": "r2"}, BODY, {})
    admitted = asyncio.create_task(d.admit(second))
    for _ in range(20):
        await asyncio.sleep(0)
    assert fc.snapshot()["queued"] == 1 and not admitted.done()
    d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=1)
    await asyncio.wait_for(admitted, 5)
    assert fc.snapshot()["queued"] == 0
    decision, _ = d.dispatch(second)
    assert decision.set_headers["x-gateway-destination-endpoint"] == "10.1.0.1:8000"
    await fc.aclose()


def flow_config(fairness: str, max_concurrency: int) -> str:
    return ("featureGates: [flowControl]\n"
            f"plugins:\n- type: concurrency-detector\n"
            f"  parameters: {{maxConcurrency: {max_concurrency}}}\n"
            f"- type: {fairness}\n"
            "saturationDetector: {pluginRef: concurrency-detector}\n"
            f"flowControl:\n  defaultPriorityBand: {{fairnessPolicyRef: {fairness}}}\n")


def tenant(request_id: str, fairness_id: str) -> dict[str, str]:
    return {":path": "/v1/completions", "x-request-id": request_id,
            "x-gateway-inference-fairness-id": fairness_id}


async def test_each_flow_counts_in_flight_from_its_pick_to_the_end_of_its_response() -> None:
    d = director(flow_config("round-robin-fairness-policy", 4))
    fc = d.runtime.flow_control
    assert fc is not None
    routed = []
    for n, t in enumerate(("a", "a", "b")):
        pending = d.prepare(tenant(f"r{n}", t), BODY, {})
        await d.admit(pending)  # fast path
        routed.append(d.dispatch(pending)[1])
    assert fc.snapshot()["bands"][0]["inflight"] == {"a": 2, "b": 1}
    for r in routed:
        d.finish(r, completed=False, status=0, response_size=0, prompt_tokens=0,
                 completion_tokens=0)  # a broken stream ends it too
    assert fc.snapshot()["bands"][0]["inflight"] == {}
    await fc.aclose()


@pytest.mark.parametrize(("fairness", "released"), [
    ("least-inflight-fairness-policy", "b"),
    ("round-robin-fairness-policy", "a"),  # the contrast: in turn, "a" first
])
async def test_the_next_free_slot_goes_to_the_flow_holding_the_fewest(
        fairness: str, released: str) -> None:
    """Tenant "a" holds both of the endpoint's slots and has another request waiting;
    tenant "b" then queues one. When a slot frees, least-inflight releases b's (0 in flight)
    where round-robin would release a's (its turn comes first)."""
    d = director(flow_config(fairness, 2))
    fc = d.runtime.flow_control
    assert fc is not None
    holding = []
    for n in range(2):
        pending = d.prepare(tenant(f"a{n}", "a"), BODY, {})
        await d.admit(pending)
        holding.append(d.dispatch(pending)[1])

    async def admit_and_pick(pending: Pending) -> Routed:  # as the ext_proc exchange does
        await d.admit(pending)
        return d.dispatch(pending)[1]

    waiting = {t: d.prepare(tenant(f"{t}-waits", t), BODY, {}) for t in ("a", "b")}
    admitted = {t: asyncio.create_task(admit_and_pick(p)) for t, p in waiting.items()}
    for _ in range(20):
        await asyncio.sleep(0)
    assert fc.snapshot()["queued"] == 2
    d.finish(holding[0], completed=True, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=1)
    await asyncio.wait_for(admitted[released], 5)
    other = "a" if released == "b" else "b"
    assert not admitted[other].done()
    assert fc.snapshot()["queued"] == 1
    await fc.aclose()
    with pytest.raises(FlowControlUnavailable):
        await admitted[other]
