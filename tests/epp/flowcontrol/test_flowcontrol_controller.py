"""The flow controller's rules, one per test: fast path, queueing, dispatch order, TTL,
cancellation, capacity, displacement, usage limits, shutdown."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from epp.flowcontrol import (
    FlowControlConfig,
    FlowController,
    FlowControlQueueFull,
    FlowControlRequest,
    FlowControlUnavailable,
    Outcome,
    PriorityBandConfig,
)
from epp.flowcontrol.policies import (
    BandThreshold,
    GlobalStrictFairness,
    PriorityUsageLimit,
    PriorityUsageLimitParameters,
    StaticUsageLimit,
)
from epp.flowcontrol.queues import Band, FlowQueue
from tests.support.fchelpers import Gate, release
from tests.support.flowcontrol import MakeFC

Log = list[tuple[str, Outcome]]


def req(rid: str, *, prio: int = 0, tenant: str = "t", size: int = 10,
        ttl: float | None = None, **kw: object) -> FlowControlRequest:
    return FlowControlRequest(request_id=rid, fairness_id=tenant, priority=prio,
                              byte_size=size, ttl=ttl, model_name="m",
                              target_model_name="m", **kw)  # type: ignore[arg-type]


def start(fc: FlowController, r: FlowControlRequest, log: Log) -> asyncio.Task[Outcome]:
    """Run one request's wait in its own task; its outcome is appended to ``log``."""
    async def wait() -> Outcome:
        outcome = await fc.enqueue_and_wait(r)
        log.append((r.request_id, outcome))
        return outcome
    return asyncio.get_running_loop().create_task(wait())


async def until(cond: object, rounds: int = 200) -> None:
    """Let other tasks run until ``cond()`` holds (bounded by rounds, not by time)."""
    for _ in range(rounds):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def queue_all(fc: FlowController, reqs: list[FlowControlRequest],
                    log: Log) -> list[asyncio.Task[Outcome]]:
    """Start requests one at a time, each queued before the next (arrival order is fixed)."""
    tasks = []
    for r in reqs:
        n = fc.length
        tasks.append(start(fc, r, log))
        await until(lambda n=n: fc.length == n + 1)
    for _ in range(5):  # and the dispatcher has seen it
        await asyncio.sleep(0)
    return tasks


def decided_at_once(fc: FlowController, r: FlowControlRequest) -> Outcome:
    """Run ``enqueue_and_wait`` to its first suspension; it must finish without one."""
    coro = fc.enqueue_and_wait(r)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the request waited")


def waits(fc: FlowController, r: FlowControlRequest) -> bool:
    """Run ``enqueue_and_wait`` to its first suspension: True if it queued there (the
    coroutine is then closed, which takes the request out of the queue again)."""
    coro = fc.enqueue_and_wait(r)
    try:
        coro.send(None)
    except StopIteration:
        return False
    coro.close()
    return True


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    v = registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


# --- fast path ---------------------------------------------------------------------------


async def test_unsaturated_pool_dispatches_at_once_without_queueing(make_fc: MakeFC,
                                                                    gate: Gate) -> None:
    gate.value = 0.2
    fc = make_fc()
    assert decided_at_once(fc, req("a")) is Outcome.DISPATCHED
    assert fc.length == 0
    assert fc.snapshot()["bands"][0]["flows"] == {}


async def test_fast_path_does_not_overtake_a_waiting_request_of_the_same_band(
        make_fc: MakeFC, gate: Gate) -> None:
    fc = make_fc(poll_interval=3600)  # the dispatcher wakes only when told
    log: Log = []
    first = await queue_all(fc, [req("first")], log)
    gate.value = 0.0  # room now, but "first" is still queued
    second = start(fc, req("second"), log)
    await asyncio.gather(*first, second)
    assert [rid for rid, _ in log] == ["first", "second"]


async def test_fast_path_is_open_to_a_higher_band_while_a_lower_one_waits(
        make_fc: MakeFC, gate: Gate) -> None:
    fc = make_fc()
    log: Log = []
    await queue_all(fc, [req("low", prio=-1)], log)
    gate.value = 0.0
    assert decided_at_once(fc, req("high", prio=5)) is Outcome.DISPATCHED
    assert fc.length == 1  # "low" still waits


async def test_a_caller_that_commits_before_yielding_never_overshoots_capacity(
        make_fc: MakeFC) -> None:
    """Saturation counts what was let through; a burst gets exactly ``limit`` fast paths."""
    inflight = 0
    limit = 3

    def saturation() -> float:
        return inflight / limit

    fc = make_fc(saturation=saturation)
    log: Log = []

    async def client(i: int) -> None:
        nonlocal inflight
        outcome = await fc.enqueue_and_wait(req(f"r{i}"))
        log.append((f"r{i}", outcome))
        inflight += 1  # the director's commit, right after admission

    tasks = [asyncio.create_task(client(i)) for i in range(10)]
    await until(lambda: len(log) == limit and fc.length == 10 - limit)
    assert [rid for rid, _ in log] == ["r0", "r1", "r2"]
    inflight = 0
    fc.notify()
    await until(lambda: len(log) >= 6)
    for _ in range(20):
        await asyncio.sleep(0)
    # The dispatcher let each released request commit before reading saturation again.
    assert [rid for rid, _ in log][3:] == ["r3", "r4", "r5"]
    inflight = 0
    fc.notify()
    await until(lambda: len(log) >= 9)
    inflight = 0
    fc.notify()
    await asyncio.gather(*tasks)
    assert [rid for rid, _ in log] == [f"r{i}" for i in range(10)]


# --- queueing and dispatch order ---------------------------------------------------------


async def test_saturated_pool_holds_the_request_until_room_and_notify(make_fc: MakeFC,
                                                                      gate: Gate) -> None:
    fc = make_fc()
    log: Log = []
    [t] = await queue_all(fc, [req("a")], log)
    assert not t.done() and fc.length == 1
    gate.value = 0.5
    fc.notify()
    assert await t is Outcome.DISPATCHED
    assert fc.length == 0


async def test_higher_priority_bands_dispatch_first(make_fc: MakeFC, gate: Gate) -> None:
    fc = make_fc()
    log: Log = []
    tasks = await queue_all(fc, [req("low1", prio=-1), req("mid1", prio=0),
                                 req("high1", prio=10), req("low2", prio=-1),
                                 req("high2", prio=10)], log)
    assert release(fc, gate, 5) == 5
    await asyncio.gather(*tasks)
    assert [rid for rid, _ in log] == ["high1", "high2", "mid1", "low1", "low2"]


async def test_round_robin_serves_tenants_in_turn(make_fc: MakeFC, gate: Gate) -> None:
    cfg = FlowControlConfig(priority_bands=(
        PriorityBandConfig(priority=0, fairness_policy_ref="round-robin-fairness-policy"),))
    fc = make_fc(cfg)
    log: Log = []
    reqs = [req(f"noisy{i}", tenant="noisy") for i in range(4)]
    reqs += [req("q1", tenant="quiet-1"), req("q2", tenant="quiet-2")]
    tasks = await queue_all(fc, reqs, log)
    release(fc, gate, 6)
    await asyncio.gather(*tasks)
    assert [rid for rid, _ in log] == ["noisy0", "q1", "q2", "noisy1", "noisy2", "noisy3"]


async def test_global_strict_serves_the_band_as_one_fcfs_queue(make_fc: MakeFC,
                                                               gate: Gate) -> None:
    fc = make_fc()  # the default fairness policy
    log: Log = []
    reqs = [req("n0", tenant="noisy"), req("n1", tenant="noisy"), req("q0", tenant="quiet"),
            req("n2", tenant="noisy")]
    tasks = await queue_all(fc, reqs, log)
    release(fc, gate, 4)
    await asyncio.gather(*tasks)
    assert [rid for rid, _ in log] == ["n0", "n1", "q0", "n2"]


async def test_edf_orders_by_deadline_and_puts_no_ttl_last(make_fc: MakeFC,
                                                           gate: Gate) -> None:
    cfg = FlowControlConfig(default_request_ttl=0, priority_bands=(
        PriorityBandConfig(priority=0, ordering_policy_ref="edf-ordering-policy"),))
    fc = make_fc(cfg)
    log: Log = []
    tasks = await queue_all(fc, [req("none"), req("late", ttl=600), req("soon", ttl=300)], log)
    release(fc, gate, 3)
    await asyncio.gather(*tasks)
    assert [rid for rid, _ in log] == ["soon", "late", "none"]


async def test_slo_deadline_orders_by_ttft_header(make_fc: MakeFC, gate: Gate) -> None:
    cfg = FlowControlConfig(priority_bands=(
        PriorityBandConfig(priority=0, ordering_policy_ref="slo-deadline-ordering-policy"),))
    fc = make_fc(cfg)
    log: Log = []
    reqs = [req("no-slo"), req("bad", headers={"x-slo-ttft-ms": "soon"}),
            req("loose", headers={"x-slo-ttft-ms": "900000"}),
            req("tight", headers={"x-slo-ttft-ms": "100000"})]
    tasks = await queue_all(fc, reqs, log)
    release(fc, gate, 4)
    await asyncio.gather(*tasks)
    assert [rid for rid, _ in log] == ["tight", "loose", "no-slo", "bad"]


async def test_usage_limit_blocks_every_band_at_its_ceiling(make_fc: MakeFC,
                                                            gate: Gate) -> None:
    cfg = FlowControlConfig(usage_limit_policy_ref="half")
    fc = make_fc(cfg, plugins={"half": StaticUsageLimit(0.5)})
    gate.value = 0.6
    log: Log = []
    [t] = await queue_all(fc, [req("a")], log)  # 0.6 >= 0.5: no fast path either
    assert not fc.dispatch_cycle()
    gate.value = 0.4
    assert fc.dispatch_cycle()
    assert await t is Outcome.DISPATCHED


async def test_no_fast_path_while_a_released_request_is_on_its_way_to_its_pick(
        make_fc: MakeFC, gate: Gate) -> None:
    fc = make_fc()
    log: Log = []
    [a] = await queue_all(fc, [req("a", prio=-1)], log)
    assert release(fc, gate) == 1  # a's caller has not resumed (nor picked) yet
    assert fc.in_transit == 1
    gate.value = 0.0  # saturation does not show a's pick yet
    # b would otherwise take a's slot: it waits instead (higher priority, empty band)
    assert waits(fc, req("b", prio=5))
    assert await a is Outcome.DISPATCHED
    assert fc.in_transit == 0
    assert fc.length == 0  # b's closed waiter took it out of the queue
    assert decided_at_once(fc, req("c", prio=5)) is Outcome.DISPATCHED


async def test_the_dispatcher_goes_on_after_each_released_request_arrives(
        make_fc: MakeFC, gate: Gate) -> None:
    fc = make_fc()
    arrivals: list[tuple[str, int]] = []

    async def one(rid: str) -> None:
        await fc.enqueue_and_wait(req(rid))
        arrivals.append((rid, fc.in_transit))  # what the caller sees when it resumes

    tasks = []
    for n, rid in enumerate(("a", "b", "c"), 1):
        tasks.append(asyncio.create_task(one(rid)))
        await until(lambda n=n: fc.length == n)
    gate.value = 0.0
    fc.notify()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)  # no wait for an arrival is lost
    assert arrivals == [("a", 0), ("b", 0), ("c", 0)]  # one in transit at a time


async def test_a_lower_ceiling_keeps_the_rest_of_the_pool_for_higher_bands(
        make_fc: MakeFC, gate: Gate) -> None:
    reserve = PriorityUsageLimit("reserve", PriorityUsageLimitParameters(
        bands=(BandThreshold(priority=-1, threshold=0.5),)))
    fc = make_fc(FlowControlConfig(usage_limit_policy_ref="reserve"),
                 plugins={"reserve": reserve})
    gate.value = 0.6
    log: Log = []
    [shed] = await queue_all(fc, [req("sheddable", prio=-1)], log)  # above its ceiling
    assert await fc.enqueue_and_wait(req("critical", prio=1)) is Outcome.DISPATCHED  # fast
    assert not fc.dispatch_cycle() and fc.length == 1
    gate.value = 0.4
    assert fc.dispatch_cycle()
    assert await shed is Outcome.DISPATCHED


async def test_a_failing_saturation_detector_counts_as_saturated(make_fc: MakeFC) -> None:
    state = {"fail": True}

    def saturation() -> float:
        if state["fail"]:
            raise RuntimeError("metrics unavailable")
        return 0.0

    fc = make_fc(saturation=saturation)
    log: Log = []
    [t] = await queue_all(fc, [req("a")], log)
    assert not fc.dispatch_cycle()
    state["fail"] = False
    fc.notify()
    assert await t is Outcome.DISPATCHED


async def test_nan_saturation_counts_as_saturated(make_fc: MakeFC, gate: Gate) -> None:
    gate.value = float("nan")
    fc = make_fc()
    log: Log = []
    [t] = await queue_all(fc, [req("a")], log)
    assert not fc.dispatch_cycle()
    t.cancel()


# --- TTL ---------------------------------------------------------------------------------


async def test_ttl_expiry_evicts_and_answers_429_with_retry_after(make_fc: MakeFC) -> None:
    fc = make_fc(pool_endpoints=lambda: 1)
    outcome = await fc.enqueue_and_wait(req("a", ttl=0.01))  # saturated throughout
    assert outcome is Outcome.EVICTED_TTL
    assert fc.length == 0 and fc.nbytes == 0
    with pytest.raises(FlowControlQueueFull) as e:
        await fc.admit(req("b", ttl=0.01))
    assert e.value.status == 429 and e.value.code == "flow_control_ttl_expired"
    assert e.value.extra_headers == {"x-llm-d-request-dropped-reason": "rejected-ttl-expired"}
    assert e.value.retry_after >= 1


async def test_ttl_expiry_with_no_endpoints_answers_503(make_fc: MakeFC) -> None:
    fc = make_fc(pool_endpoints=lambda: 0)
    with pytest.raises(FlowControlUnavailable) as e:
        await fc.admit(req("b", ttl=0.01))
    assert e.value.status == 503 and e.value.code == "no_endpoints"
    assert e.value.extra_headers == {"x-llm-d-request-dropped-reason": "rejected-no-endpoints"}


async def test_full_queue_with_no_endpoints_is_rejected_no_endpoints(make_fc: MakeFC) -> None:
    fc = make_fc(FlowControlConfig(default_priority_band=PriorityBandConfig(max_requests=1)),
                 pool_endpoints=lambda: 0)
    waiting = asyncio.ensure_future(fc.enqueue_and_wait(req("a")))
    await asyncio.sleep(0)
    assert await fc.enqueue_and_wait(req("b")) is Outcome.REJECTED_NO_ENDPOINTS
    waiting.cancel()


async def test_no_endpoint_request_ttl_bounds_the_wait_only_while_the_pool_is_empty(
        make_fc: MakeFC) -> None:
    endpoints = [0]
    fc = make_fc(FlowControlConfig(no_endpoint_request_ttl=0.05),
                 pool_endpoints=lambda: endpoints[0])
    t0 = asyncio.get_running_loop().time()
    assert await fc.enqueue_and_wait(req("a")) is Outcome.EVICTED_TTL
    assert asyncio.get_running_loop().time() - t0 < 1.0  # not the 60 s default TTL
    endpoints[0] = 1  # endpoints, still saturated: the request waits on
    waiting = asyncio.ensure_future(fc.enqueue_and_wait(req("b")))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    waiting.cancel()


async def test_no_endpoint_request_ttl_zero_refuses_at_once(make_fc: MakeFC) -> None:
    fc = make_fc(FlowControlConfig(no_endpoint_request_ttl=0), pool_endpoints=lambda: 0)
    assert await fc.enqueue_and_wait(req("a")) is Outcome.REJECTED_NO_ENDPOINTS
    with pytest.raises(FlowControlUnavailable) as e:
        await fc.admit(req("b"))
    assert e.value.status == 503


async def test_bands_are_bounded_by_default_at_5000_requests(make_fc: MakeFC) -> None:
    fc = make_fc()
    band = fc.config.band(0)
    assert band.max_requests == 0 and band.effective_max_requests == 5000
    assert fc.config.default_request_ttl == 60.0


async def test_default_request_ttl_applies_when_the_request_has_none(make_fc: MakeFC) -> None:
    fc = make_fc(FlowControlConfig(default_request_ttl=0.01))
    assert await fc.enqueue_and_wait(req("a")) is Outcome.EVICTED_TTL


async def test_without_any_ttl_a_request_waits_until_released(make_fc: MakeFC,
                                                              gate: Gate) -> None:
    fc = make_fc(FlowControlConfig(default_request_ttl=0))
    log: Log = []
    [t] = await queue_all(fc, [req("a")], log)
    for _ in range(50):
        await asyncio.sleep(0)
    assert not t.done()
    release(fc, gate)
    assert await t is Outcome.DISPATCHED


# --- client gone -------------------------------------------------------------------------


async def test_cancelled_caller_leaves_the_queue_at_once(make_fc: MakeFC,
                                                         registry: CollectorRegistry) -> None:
    fc = make_fc()
    log: Log = []
    [t] = await queue_all(fc, [req("a", tenant="gone", size=123)], log)
    assert sample(registry, "inference_extension_flow_control_queue_bytes",
                  fairness_id="gone", priority="0", inference_pool="pool-a",
                  model_name="m", target_model_name="m") == 123
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert fc.length == 0 and fc.nbytes == 0
    assert fc.snapshot()["bands"][0]["flows"] == {}
    # The flow's gauge series is gone, not left at zero.
    assert registry.get_sample_value(
        "inference_extension_flow_control_queue_size",
        {"fairness_id": "gone", "priority": "0", "inference_pool": "pool-a",
         "model_name": "m", "target_model_name": "m"}) is None
    assert sample(registry, "inference_extension_flow_control_request_queue_duration_seconds_count",
                  fairness_id="gone", priority="0", outcome="EvictedContextCancelled",
                  inference_pool="pool-a", model_name="m", target_model_name="m") == 1


async def test_cancelled_request_frees_its_capacity_slot(make_fc: MakeFC) -> None:
    fc = make_fc(FlowControlConfig(max_requests=1))
    log: Log = []
    [t] = await queue_all(fc, [req("a")], log)
    assert await fc.enqueue_and_wait(req("b")) is Outcome.REJECTED_CAPACITY
    t.cancel()
    await asyncio.gather(t, return_exceptions=True)
    await queue_all(fc, [req("c")], log)
    assert fc.length == 1


# --- capacity and displacement -----------------------------------------------------------


async def test_band_max_requests_rejects_with_429_and_retry_after(make_fc: MakeFC) -> None:
    cfg = FlowControlConfig(priority_bands=(PriorityBandConfig(priority=0, max_requests=2),))
    fc = make_fc(cfg)
    log: Log = []
    await queue_all(fc, [req("a"), req("b")], log)
    with pytest.raises(FlowControlQueueFull) as e:
        await fc.admit(req("c"))
    assert e.value.status == 429 and e.value.code == "flow_control_queue_full"
    assert e.value.retry_after == 10  # nothing dispatched lately
    assert fc.length == 2


async def test_band_max_bytes_rejects_by_size(make_fc: MakeFC) -> None:
    cfg = FlowControlConfig(priority_bands=(PriorityBandConfig(priority=0, max_bytes=100),))
    fc = make_fc(cfg)
    log: Log = []
    await queue_all(fc, [req("a", size=60)], log)
    assert await fc.enqueue_and_wait(req("big", size=41)) is Outcome.REJECTED_CAPACITY
    await queue_all(fc, [req("fits", size=40)], log)
    assert fc.nbytes == 100


async def test_unlisted_priority_gets_the_default_band_template(make_fc: MakeFC) -> None:
    cfg = FlowControlConfig(default_priority_band=PriorityBandConfig(max_requests=1))
    fc = make_fc(cfg)
    log: Log = []
    await queue_all(fc, [req("a", prio=7)], log)
    assert await fc.enqueue_and_wait(req("b", prio=7)) is Outcome.REJECTED_CAPACITY
    await queue_all(fc, [req("c", prio=8)], log)  # another priority, its own band


async def test_full_queue_displaces_the_lowest_band_newest_of_heaviest_flow(
        make_fc: MakeFC, gate: Gate) -> None:
    fc = make_fc(FlowControlConfig(max_requests=4))
    log: Log = []
    tasks = await queue_all(fc, [req("mid", prio=0), req("low-n0", prio=-5, tenant="noisy"),
                                 req("low-q0", prio=-5, tenant="quiet"),
                                 req("low-n1", prio=-5, tenant="noisy")], log)
    high = start(fc, req("high", prio=10), log)
    await until(lambda: log)
    assert log == [("low-n1", Outcome.EVICTED_DISPLACED)]
    assert fc.length == 4
    release(fc, gate, 4)
    await asyncio.gather(*tasks, high)
    assert [rid for rid, _ in log[1:]] == ["high", "mid", "low-n0", "low-q0"]


async def test_displaced_request_gets_429(make_fc: MakeFC) -> None:
    fc = make_fc(FlowControlConfig(max_requests=1))
    low = asyncio.create_task(fc.admit(req("low", prio=-1)))
    await until(lambda: fc.length == 1)
    high = asyncio.create_task(fc.admit(req("high", prio=1)))
    with pytest.raises(FlowControlQueueFull) as e:
        await low
    assert e.value.status == 429 and e.value.code == "flow_control_displaced"
    high.cancel()


async def test_full_queue_rejects_the_newcomer_when_no_lower_band_waits(make_fc: MakeFC) -> None:
    fc = make_fc(FlowControlConfig(max_requests=2))
    log: Log = []
    await queue_all(fc, [req("a", prio=0), req("b", prio=5)], log)
    assert await fc.enqueue_and_wait(req("c", prio=0)) is Outcome.REJECTED_CAPACITY
    assert await fc.enqueue_and_wait(req("d", prio=-3)) is Outcome.REJECTED_CAPACITY
    assert log == [] and fc.length == 2


async def test_displacement_happens_only_if_it_frees_enough(make_fc: MakeFC) -> None:
    fc = make_fc(FlowControlConfig(max_bytes=100))
    log: Log = []
    await queue_all(fc, [req("peer", prio=9, size=70), req("low", prio=-1, size=20)], log)
    # Needs 50 bytes freed; only 20 sit in lower bands: refuse, displace nothing.
    assert await fc.enqueue_and_wait(req("high", prio=9, size=60)) is Outcome.REJECTED_CAPACITY
    assert log == [] and fc.length == 2
    # Needs 20 freed: the low request goes.
    start(fc, req("high2", prio=9, size=30), log)
    await until(lambda: log)
    assert log == [("low", Outcome.EVICTED_DISPLACED)]
    assert fc.nbytes == 100


async def test_a_band_own_limit_is_never_fixed_by_displacing_others(make_fc: MakeFC) -> None:
    cfg = FlowControlConfig(max_requests=10,
                            priority_bands=(PriorityBandConfig(priority=9, max_requests=1),))
    fc = make_fc(cfg)
    log: Log = []
    await queue_all(fc, [req("low", prio=-1), req("h1", prio=9)], log)
    assert await fc.enqueue_and_wait(req("h2", prio=9)) is Outcome.REJECTED_CAPACITY
    assert log == []


# --- shutdown ----------------------------------------------------------------------------


async def test_shutdown_evicts_queued_and_refuses_new(make_fc: MakeFC) -> None:
    fc = make_fc()
    log: Log = []
    tasks = await queue_all(fc, [req("a"), req("b", prio=3)], log)
    await fc.aclose()
    assert set(await asyncio.gather(*tasks)) == {Outcome.EVICTED_OTHER}
    assert fc.length == 0
    with pytest.raises(FlowControlUnavailable) as e:
        await fc.admit(req("c"))
    assert e.value.status == 503


async def test_shutdown_with_release_dispatches_queued_and_refuses_new(
        make_fc: MakeFC) -> None:
    fc = make_fc()
    log: Log = []
    tasks = await queue_all(fc, [req("a"), req("b", prio=3)], log)
    await fc.aclose(release=True)  # a FailOpen pool's EPP going away
    assert set(await asyncio.gather(*tasks)) == {Outcome.DISPATCHED}
    assert fc.length == 0 and fc.nbytes == 0
    with pytest.raises(FlowControlUnavailable):
        await fc.admit(req("c"))


# --- retry-after and bookkeeping ---------------------------------------------------------


async def test_retry_after_is_backlog_over_recent_dispatch_rate(make_fc: MakeFC) -> None:
    fc = make_fc()
    log: Log = []
    await queue_all(fc, [req(f"r{i}") for i in range(10)], log)
    assert fc.retry_after() == 10  # nothing dispatched yet
    now = 1000.0
    fc._dispatched.extend([now - 2.0, now - 1.0, now])  # 1 request/s, 10 queued
    assert fc.retry_after(now) == 10
    fc._dispatched.extend([now] * 20)  # 22 in 2 s
    assert fc.retry_after(now) == 1
    assert fc.retry_after(now + 30) == 10  # all older than the window


async def test_queue_memory_stays_bounded_when_waiters_leave_from_the_middle(
        make_fc: MakeFC, gate: Gate) -> None:
    fc = make_fc()
    log: Log = []
    tasks = [start(fc, req(f"r{i}", tenant="one"), log) for i in range(600)]
    await until(lambda: fc.length == 600)
    for t in tasks[100:500]:
        t.cancel()
    await asyncio.gather(*tasks[100:500], return_exceptions=True)
    flow = fc._bands[0].flows["one"]
    assert flow.length == 200
    assert flow.heap_entries() <= 4 * flow.length + 130
    assert release(fc, gate, 200) == 200
    await asyncio.gather(*tasks[:100], *tasks[500:])
    assert [rid for rid, _ in log] == [f"r{i}" for i in (*range(100), *range(500, 600))]


async def test_dispatcher_survives_a_failing_policy(make_fc: MakeFC, gate: Gate) -> None:
    class Flaky(GlobalStrictFairness):
        calls = 0

        def pick(self, band: Band) -> FlowQueue | None:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("plugin bug")
            return super().pick(band)

    cfg = FlowControlConfig(priority_bands=(
        PriorityBandConfig(priority=0, fairness_policy_ref="flaky"),))
    fc = make_fc(cfg, plugins={"flaky": Flaky()})
    log: Log = []
    [t] = await queue_all(fc, [req("a")], log)
    gate.value = 0.0
    fc.notify()
    assert await t is Outcome.DISPATCHED
    assert Flaky.calls >= 2


async def test_snapshot_shows_bands_flows_and_limits(make_fc: MakeFC) -> None:
    cfg = FlowControlConfig(priority_bands=(
        PriorityBandConfig(priority=5, max_requests=9,
                           fairness_policy_ref="round-robin-fairness-policy"),))
    fc = make_fc(cfg)
    log: Log = []
    await queue_all(fc, [req("a", prio=5, tenant="x", size=3), req("b", prio=5, tenant="y"),
                         req("c", prio=-1, tenant="x", size=4)], log)
    snap = fc.snapshot()
    assert (snap["queued"], snap["bytes"]) == (3, 17)
    high, low = snap["bands"]
    assert high == {"priority": 5, "queued": 2, "bytes": 13, "maxBytes": 1_000_000_000,
                    "maxRequests": 9, "fairnessPolicy": "round-robin-fairness-policy",
                    "orderingPolicy": "fcfs-ordering-policy",
                    "flows": {"x": {"queued": 1, "bytes": 3}, "y": {"queued": 1, "bytes": 10}},
                    "inflight": {}}
    assert low["priority"] == -1 and low["flows"] == {"x": {"queued": 1, "bytes": 4}}


async def test_inflight_per_flow_counts_started_until_ended_never_below_zero(
        make_fc: MakeFC) -> None:
    fc = make_fc(FlowControlConfig())
    fc.started(0, "x")
    fc.started(0, "x")
    fc.started(0, "y")
    fc.started(-1, "x")  # another band: counted apart
    fc.ended(0, "y")
    fc.ended(0, "y")  # one end too many: stays gone, never negative
    fc.ended(7, "z")  # a band that never existed: nothing to do, no error
    bands = {b["priority"]: b["inflight"] for b in fc.snapshot()["bands"]}
    assert bands == {0: {"x": 2}, -1: {"x": 1}}
    fc.ended(0, "x")
    fc.ended(0, "x")
    assert {b["priority"]: b["inflight"] for b in fc.snapshot()["bands"]}[0] == {}
