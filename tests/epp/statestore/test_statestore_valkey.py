"""The Valkey store against a real valkey-server: what one replica writes, the others see."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import valkey
from prometheus_client import REGISTRY
from valkey.asyncio.connection import SSLConnection

from devkit.valkey import ValkeyServer
from epp.statestore import InFlight, ValkeyStateStore, open_store, parse_store_url

Replicas = Callable[..., Awaitable[ValkeyStateStore]]
Eventually = Callable[[Callable[[], bool], str], Awaitable[None]]


def sample(name: str, operation: str) -> float:
    return REGISTRY.get_sample_value(name, {"store": "valkey", "operation": operation}) or 0.0


def raw(url: str) -> valkey.Valkey:
    u = parse_store_url(url)
    return valkey.Valkey(host=u.host, port=u.port, password=u.password)


def test_valkey_url_opens_the_shared_store() -> None:
    store = open_store("valkey://127.0.0.1:1/0", pool="p", replica="r1")
    assert isinstance(store, ValkeyStateStore)
    assert store.replica == "r1"


def test_valkeys_url_connects_over_tls() -> None:
    store = ValkeyStateStore(parse_store_url("valkeys://h:1/0?ssl_cert_reqs=none"))
    client = store._new_client()
    assert client.connection_pool.connection_class is SSLConnection
    assert client.connection_pool.connection_kwargs["ssl_cert_reqs"] == "none"


async def test_each_replica_sees_the_sum_of_all_replicas_inflight(
        store_url: str, replicas: Replicas) -> None:
    a = await replicas(store_url, "a")
    b = await replicas(store_url, "b")
    a.add_inflight("10.0.0.1:8000", 2, 200)
    b.add_inflight("10.0.0.1:8000", 1, 10)
    await a.sync()
    await b.sync()
    await a.sync()
    assert a.inflight("10.0.0.1:8000") == InFlight(3, 210)
    assert b.inflight("10.0.0.1:8000") == InFlight(3, 210)


async def test_released_requests_leave_the_other_replicas_view(
        store_url: str, replicas: Replicas) -> None:
    a = await replicas(store_url, "a")
    b = await replicas(store_url, "b")
    a.add_inflight("e", 1, 5)
    await a.sync()
    await b.sync()
    assert b.inflight("e") == InFlight(1, 5)
    a.add_inflight("e", -1, -5)
    await a.sync()
    await b.sync()
    assert b.inflight("e") == InFlight(0, 0)


async def test_a_dead_replicas_counts_expire(
        store_url: str, replicas: Replicas, eventually: Eventually) -> None:
    a = await replicas(store_url, "a", inflight_ttl=0.3)
    b = await replicas(store_url, "b")
    a.add_inflight("e", 4, 40)
    await a.sync()
    await b.sync()
    assert b.inflight("e") == InFlight(4, 40)
    for task in a._tasks:  # the replica dies: no more pushes, no goodbye
        task.cancel()
    await eventually(lambda: b.inflight("e") == InFlight(0, 0), "a's counts expired")


async def test_a_replica_that_closes_takes_its_counts_away_at_once(
        store_url: str, replicas: Replicas) -> None:
    a = await replicas(store_url, "a", inflight_ttl=3600)
    b = await replicas(store_url, "b")
    a.add_inflight("e", 1, 1)
    await a.sync()
    await a.close()
    await b.sync()
    assert b.inflight("e") == InFlight(0, 0)


async def test_prefix_writes_reach_the_other_replicas(
        store_url: str, replicas: Replicas, eventually: Eventually) -> None:
    a = await replicas(store_url, "a")
    b = await replicas(store_url, "b")
    await eventually(lambda: b.shared, "b subscribed")
    a.prefix_add("10.0.0.1:8000", [11, 12, 13], capacity=100)
    await a.sync()
    await eventually(lambda: b.prefix_match([11, 12, 13, 14]) == {"10.0.0.1:8000": 3},
                     "b learned a's blocks")


async def test_a_replica_that_joins_later_loads_the_shared_index(
        store_url: str, replicas: Replicas, eventually: Eventually) -> None:
    a = await replicas(store_url, "a")
    a.prefix_add("e1", [1, 2], capacity=100)
    a.prefix_add("e2", [1], capacity=100)
    await a.sync()
    late = await replicas(store_url, "late")
    await eventually(lambda: late.shared, "late joined")
    assert late.prefix_match([1, 2]) == {"e1": 2, "e2": 1}


async def test_the_shared_index_is_trimmed_to_each_endpoints_capacity(
        store_url: str, replicas: Replicas) -> None:
    a = await replicas(store_url, "a")
    a.prefix_add("e", [1, 2, 3], capacity=4)
    a.prefix_add("e", [4, 5], capacity=4)
    await a.sync()
    with raw(store_url) as r:
        kept = [int(h) for h in r.zrange("gie:pool-a:prefix:e", 0, -1)]
        ttl = r.pttl("gie:pool-a:prefix:e")
    assert kept == [2, 3, 4, 5]  # least recently used first out
    assert 0 < ttl <= a.prefix_ttl * 1000


async def test_sessions_reach_other_replicas_and_late_joiners(
        store_url: str, replicas: Replicas, eventually: Eventually) -> None:
    a = await replicas(store_url, "a")
    b = await replicas(store_url, "b")
    await eventually(lambda: b.shared, "b subscribed")
    a.session_set("user-7", "10.0.0.2:8000")
    await a.sync()
    await eventually(lambda: b.session_get("user-7") == "10.0.0.2:8000", "b got the session")
    late = await replicas(store_url, "late")
    await eventually(lambda: late.shared, "late joined")
    assert late.session_get("user-7") == "10.0.0.2:8000"
    with raw(store_url) as r:
        assert 0 < r.pttl("gie:pool-a:session:user-7") <= a.session_ttl * 1000


async def test_pools_in_one_namespace_do_not_mix(store_url: str, replicas: Replicas) -> None:
    a = await replicas(store_url, "a")
    other = ValkeyStateStore(parse_store_url(store_url), pool="pool-b", replica="x")
    await other.start()
    try:
        other.add_inflight("e", 5, 5)
        await other.sync()
        await a.sync()
        assert a.inflight("e") == InFlight(0, 0)
    finally:
        await other.close()


async def test_sync_operations_are_counted_and_timed(
        store_url: str, replicas: Replicas, eventually: Eventually) -> None:
    a = await replicas(store_url, "a")
    # Up means pushing, pulling and subscribed to the feed (the feed joins in the background).
    await eventually(lambda: a.shared, "a joined")
    ops = sample("inference_extension_state_store_operations_total", "push")
    timed = sample("inference_extension_state_store_operation_duration_seconds_count", "push")
    await a.sync()
    assert sample("inference_extension_state_store_operations_total", "push") >= ops + 1
    assert sample("inference_extension_state_store_operation_duration_seconds_count",
                  "push") >= timed + 1
    assert REGISTRY.get_sample_value("inference_extension_state_store_up",
                                     {"store": "valkey"}) == 1


async def test_password_protected_server(replicas: Replicas) -> None:
    with ValkeyServer(password="s3cret") as server:
        a = await replicas(server.url, "a")
        b = await replicas(server.url, "b")
        a.add_inflight("e", 1, 0)
        await a.sync()
        await b.sync()
        assert b.inflight("e") == InFlight(1, 0)


async def test_wrong_password_means_local_state_and_an_error(replicas: Replicas) -> None:
    with ValkeyServer(password="s3cret") as server:
        errors = sample("inference_extension_state_store_errors_total", "push")
        a = await replicas(server.url.replace("s3cret", "wrong"), "a")
        assert not a.shared
        assert sample("inference_extension_state_store_errors_total", "push") >= errors + 1
        a.add_inflight("e", 1, 0)
        assert a.inflight("e") == InFlight(1, 0)


@pytest.mark.parametrize("n", [3])
async def test_three_replicas_agree(store_url: str, replicas: Replicas, n: int) -> None:
    stores = [await replicas(store_url, f"r{i}") for i in range(n)]
    for i, s in enumerate(stores):
        s.add_inflight("e", i + 1, 0)
    for s in stores:
        await s.sync()
    for s in stores:
        await s.sync()
    assert [s.inflight("e").requests for s in stores] == [6, 6, 6]


async def test_full_64_bit_block_hashes_survive_the_round_trip(
        store_url: str, replicas: Replicas, eventually: Eventually) -> None:
    hashes = [2**64 - 1, 2**63 + 1, 2**53 + 1]  # beyond a double's exact integers
    a = await replicas(store_url, "a")
    b = await replicas(store_url, "b")
    await eventually(lambda: b.shared, "b subscribed")
    a.prefix_add("e", hashes, capacity=10)
    await a.sync()
    await eventually(lambda: b.prefix_match(hashes) == {"e": 3}, "b got exact hashes")
    late = await replicas(store_url, "late")
    await eventually(lambda: late.shared, "late joined")
    assert late.prefix_match(hashes) == {"e": 3}


async def test_a_backlog_goes_out_in_bounded_batches_and_none_is_lost(
        store_url: str, replicas: Replicas, eventually: Eventually) -> None:
    import orjson
    import valkey.asyncio as avalkey

    from epp.statestore.valkey import PUSH_BATCH
    listener = avalkey.Valkey(port=parse_store_url(store_url).port)
    feed = listener.pubsub()
    await feed.subscribe("gie:pool-a:updates")
    a = await replicas(store_url, "a")
    writes = PUSH_BATCH * 2 + 200
    for i in range(writes):
        a.prefix_add(f"e{i % 10}", [i], capacity=0)
    batches: list[int] = []
    misses = 0
    try:
        while sum(batches) < writes:
            # None also stands for the (ignored) subscribe confirmation: allow a few.
            message = await feed.get_message(ignore_subscribe_messages=True, timeout=5)
            if message is None:
                misses += 1
                assert misses < 3, f"only {sum(batches)} of {writes} writes published"
                continue
            # A published update is <mac>.<json>.
            batches.append(len(orjson.loads(message["data"].partition(b".")[2])["p"]))
    finally:
        await feed.aclose()
        await listener.aclose()
    assert max(batches) <= PUSH_BATCH < writes
    assert a.backlog == 0
    late = await replicas(store_url, "late")
    await eventually(lambda: late.shared, "late joined")
    assert all(late.prefix_match([i]) for i in range(writes))
