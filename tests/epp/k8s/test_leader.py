"""Leader election on a Lease between EPP replicas, against the fake API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from epp.leader import LeaderElector, report_readiness
from tests.support.fake_apiserver import FakeApiServer

LEASE = "epp-llm-pool-a.inference-gateway"
# Scaled-down client-go timings (15 s / 10 s / 2 s) so hand-overs take about a second.
TIMING = {"lease_duration": 1.0, "renew_deadline": 0.6, "retry_period": 0.1}

pytestmark = pytest.mark.serial  # hand-overs are held to those (scaled-down) durations


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def elector(kube: Any, identity: str, **kwargs: Any,
                  ) -> AsyncIterator[tuple[LeaderElector, asyncio.Task[None]]]:
    e = LeaderElector(LEASE, "llm", api_client=kube, identity=identity, **{**TIMING, **kwargs})
    task = asyncio.create_task(e.run())
    try:
        yield e, task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def holder(apiserver: FakeApiServer) -> str | None:
    lease = apiserver.get("coordination.k8s.io/v1", "Lease", LEASE, "llm")
    return lease["spec"].get("holderIdentity") if lease else None


async def test_first_candidate_creates_the_lease_and_leads(apiserver: FakeApiServer,
                                                           kube: Any) -> None:
    changes: list[bool] = []
    async with elector(kube, "a", on_change=changes.append) as (a, _):
        await asyncio.wait_for(a.leading.wait(), 3)
        assert a.is_leader
        assert holder(apiserver) == "a"
        assert changes == [True]


async def test_standby_stays_follower_while_the_leader_renews(apiserver: FakeApiServer,
                                                              kube: Any) -> None:
    async with elector(kube, "a") as (a, _):
        await asyncio.wait_for(a.leading.wait(), 3)
        async with elector(kube, "b") as (b, _):
            await asyncio.sleep(2.0)  # two lease durations: renewals keep "a" in charge
            assert a.is_leader and not b.is_leader
            assert holder(apiserver) == "a"


async def test_released_lease_hands_over_within_a_retry(apiserver: FakeApiServer,
                                                        kube: Any) -> None:
    async with elector(kube, "b") as (b, _):
        async with elector(kube, "a") as (a, _):
            await eventually(lambda: a.is_leader or b.is_leader)
        # Whoever led, "a" is gone now; "b" must be (or become) the leader quickly.
        loop = asyncio.get_running_loop()
        start = loop.time()
        await eventually(lambda: b.is_leader, timeout=3)
        assert loop.time() - start < 1.0
        assert holder(apiserver) == "b"


async def test_crashed_leader_is_replaced_within_the_lease_duration(apiserver: FakeApiServer,
                                                                    kube: Any) -> None:
    async with elector(kube, "a") as (a, a_task):
        await asyncio.wait_for(a.leading.wait(), 3)
        async with elector(kube, "b") as (b, _):
            await asyncio.sleep(0.3)
            apiserver.forbid("leases")  # "a" can no longer renew ...
            await eventually(lambda: not a.is_leader, timeout=3)
            a_task.cancel()  # ... and dies without releasing
            with contextlib.suppress(asyncio.CancelledError):
                await a_task
            apiserver.allow("leases")
            loop = asyncio.get_running_loop()
            start = loop.time()
            await eventually(lambda: b.is_leader, timeout=3)
            assert loop.time() - start <= TIMING["lease_duration"] + 0.5
    lease = apiserver.get("coordination.k8s.io/v1", "Lease", LEASE, "llm")
    assert lease is not None and lease["spec"]["leaseTransitions"] >= 1


async def test_leader_that_cannot_renew_stops_leading_by_the_deadline(
        apiserver: FakeApiServer, kube: Any) -> None:
    async with elector(kube, "a") as (a, _):
        await asyncio.wait_for(a.leading.wait(), 3)
        apiserver.forbid("leases")
        loop = asyncio.get_running_loop()
        start = loop.time()
        await eventually(lambda: not a.is_leader, timeout=3)
        # Stops before the lease could expire for others: renew_deadline < lease_duration.
        assert loop.time() - start < TIMING["lease_duration"]


async def test_only_one_of_many_candidates_leads(apiserver: FakeApiServer, kube: Any) -> None:
    async with contextlib.AsyncExitStack() as stack:
        electors = [(await stack.enter_async_context(elector(kube, f"c{i}")))[0]
                    for i in range(4)]
        await eventually(lambda: any(e.is_leader for e in electors))
        await asyncio.sleep(0.5)
        assert sum(e.is_leader for e in electors) == 1


def test_timings_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="lease_duration > renew_deadline > retry_period"):
        LeaderElector(LEASE, "llm", lease_duration=1, renew_deadline=2, retry_period=0.1)


async def test_stop_event_releases_the_lease_for_the_standby(apiserver: FakeApiServer,
                                                             kube: Any) -> None:
    stop = asyncio.Event()
    a = LeaderElector(LEASE, "llm", api_client=kube, identity="a", **TIMING)
    a_task = asyncio.create_task(a.run(stop))
    await asyncio.wait_for(a.leading.wait(), 3)
    async with elector(kube, "b") as (b, _):
        stop.set()  # the EPP starts draining
        await asyncio.wait_for(a_task, 3)
        assert not a.is_leader
        await eventually(lambda: b.is_leader, timeout=1.0)


async def test_readiness_follows_leadership(apiserver: FakeApiServer, kube: Any) -> None:
    reported: list[bool] = []

    async def set_serving(serving: bool) -> None:
        reported.append(serving)

    synced = asyncio.Event()
    async with elector(kube, "a") as (a, _):
        ready = asyncio.create_task(report_readiness(set_serving, synced, a))
        await asyncio.wait_for(a.leading.wait(), 3)
        await asyncio.sleep(0.1)
        assert reported == []  # leader, but the pool has not synced yet
        synced.set()
        await eventually(lambda: reported == [True])
        apiserver.forbid("leases")
        await eventually(lambda: reported == [True, False], timeout=3)
        ready.cancel()


async def test_readiness_without_election_is_just_synced() -> None:
    reported: list[bool] = []

    async def set_serving(serving: bool) -> None:
        reported.append(serving)

    synced = asyncio.Event()
    task = asyncio.create_task(report_readiness(set_serving, synced))
    await asyncio.sleep(0.05)
    assert reported == []
    synced.set()
    await asyncio.wait_for(task, 1)
    assert reported == [True]


async def test_a_cancelled_attempt_never_returns_its_result() -> None:
    """Cancelling the campaign while a Lease call finishes in its thread must cancel it: a
    swallowed cancel (Python 3.11's wait_for loses one in a few percent of these races)
    leaves the campaign renewing forever and run() never returns."""
    e = LeaderElector(LEASE, "llm", api_client=object(), identity="a", **TIMING)
    swallowed = 0
    for i in range(2000):
        task = asyncio.create_task(e._try(lambda: True))
        for _ in range(i % 7):  # cancel at every stage of the thread's round trip
            await asyncio.sleep(0)
        accepted = task.cancel()
        try:
            await task
            swallowed += accepted
        except asyncio.CancelledError:
            pass
    assert swallowed == 0
