"""Valkey down and back: replicas keep routing on local state, warn, count it, and re-join."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from devkit.valkey import ValkeyServer
from epp.statestore import InFlight, ValkeyStateStore

Replicas = Callable[..., Awaitable[ValkeyStateStore]]
Eventually = Callable[[Callable[[], bool], str], Awaitable[None]]


def errors(operation: str) -> float:
    return REGISTRY.get_sample_value("inference_extension_state_store_errors_total",
                                     {"store": "valkey", "operation": operation}) or 0.0


def up() -> float | None:
    return REGISTRY.get_sample_value("inference_extension_state_store_up", {"store": "valkey"})


async def test_valkey_killed_and_restarted(
        fresh_valkey: ValkeyServer, replicas: Replicas, eventually: Eventually) -> None:
    a = await replicas(fresh_valkey.url, "a")
    b = await replicas(fresh_valkey.url, "b")
    await eventually(lambda: a.shared and b.shared, "both replicas joined")
    a.add_inflight("e", 2, 20)
    await a.sync()
    await b.sync()
    assert b.inflight("e") == InFlight(2, 20)

    push_errors = errors("push")
    with capture_logs() as logs:
        fresh_valkey.kill()

        def warned() -> list[str]:
            return [e["replica"] for e in logs if e["log_level"] == "warning"]
        await eventually(lambda: len(warned()) == 2, "each replica warned")
        await eventually(lambda: errors("push") > push_errors, "failed pushes counted")
    # One warning per replica per outage, naming the store and the replica.
    assert sorted(warned()) == ["a", "b"]
    assert {e["event"] for e in logs if e["log_level"] == "warning"} == {
        "state store unreachable; routing on this replica's local state"}
    assert not a.shared and not b.shared
    assert up() == 0
    # Local state goes on: own counts and own prefix writes; the others' counts are dropped
    # since they can no longer be known.
    assert b.inflight("e") == InFlight(0, 0)
    b.add_inflight("e", 1, 1)
    assert b.inflight("e") == InFlight(1, 1)
    a.prefix_add("e", [41, 42], capacity=100)  # written during the outage
    assert a.prefix_match([41, 42]) == {"e": 2}
    assert b.prefix_match([41]) == {}

    fresh_valkey.start()  # same port, empty: the replicas refill it
    await eventually(lambda: a.shared and b.shared, "both replicas re-joined")
    await eventually(lambda: b.inflight("e") == InFlight(3, 21), "b sees a's counts again")
    await eventually(lambda: a.inflight("e") == InFlight(3, 21), "a sees b's counts again")
    await eventually(lambda: b.prefix_match([41, 42]) == {"e": 2},
                     "a's outage-time prefix writes reached b")
    assert up() == 1


async def test_a_replica_starts_while_valkey_is_down_and_joins_later(
        replicas: Replicas, eventually: Eventually) -> None:
    server = ValkeyServer()  # port chosen, server not started
    try:
        with capture_logs() as logs:
            a = await replicas(server.url, "a")
        assert not a.shared
        assert any(e["log_level"] == "warning" for e in logs)
        a.add_inflight("e", 1, 0)
        a.prefix_add("e", [7], capacity=10)
        assert (a.inflight("e"), a.prefix_match([7])) == (InFlight(1, 0), {"e": 1})
        server.start()
        await eventually(lambda: a.shared, "a joined once Valkey answered")
        b = await replicas(server.url, "b")
        await eventually(lambda: b.shared, "b joined")
        await b.sync()
        assert b.inflight("e") == InFlight(1, 0)
        assert b.prefix_match([7]) == {"e": 1}
    finally:
        server.close()


async def test_writes_queued_during_an_outage_are_bounded_newest_kept(
        replicas: Replicas, eventually: Eventually, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("epp.statestore.valkey.MAX_PENDING", 20)
    server = ValkeyServer()
    try:
        a = await replicas(server.url, "a")
        for i in range(50):
            a.prefix_add("e", [i], capacity=0)
            a.session_set(f"s{i}", "x")
        assert a.backlog == 40  # 20 prefix writes + 20 sessions
        assert a.prefix_match([0]) == {"e": 1}  # the local index keeps everything
        server.start()
        late = await replicas(server.url, "late")
        await eventually(lambda: a.shared and late.shared and a.backlog == 0, "a caught up")
        await eventually(lambda: late.prefix_match([49]) == {"e": 1}, "newest write arrived")
        assert late.prefix_match([29]) == {}  # dropped while queued
        assert late.session_get("s49") == "x"
        assert late.session_get("s29") is None
    finally:
        server.close()
