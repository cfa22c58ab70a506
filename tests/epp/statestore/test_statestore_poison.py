"""A poisoned store (issue 31, items 2 and 3), against a real Valkey.

Each write the issue names — a bad in-flight value, a bad PUBLISH payload, a non-integer
prefix member — and random bytes in each place change nothing but a counted, logged
rejection: sharing goes on, the health gauge stays true, a replica started later joins, and
``close()`` is clean. With a shared secret a forged replica (no secret, a wrong one, or a real
replica's value copied under another name) moves no count and no prefix match.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import orjson
import pytest
import valkey
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from epp.statestore import InFlight, ValkeyStateStore, parse_store_url
from epp.statestore.codec import Codec

Replicas = Callable[..., Awaitable[ValkeyStateStore]]
Eventually = Callable[[Callable[[], bool], str], Awaitable[None]]
NS = "gie:pool-a"
SECRET = b"0123456789abcdef-shared"


def rejected(source: str) -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "inference_extension_state_store_rejected":
            total += sum(s.value for s in metric.samples
                         if s.name.endswith("_total") and s.labels["source"] == source)
    return total


def up() -> float | None:
    return REGISTRY.get_sample_value("inference_extension_state_store_up", {"store": "valkey"})


async def start(url: str, name: str, secret: bytes | None = SECRET) -> ValkeyStateStore:
    signed = {"secret": secret} if secret is not None else {}
    store = ValkeyStateStore(parse_store_url(url), pool="pool-a", replica=name, **signed)
    await store.start()
    return store


async def still_sharing(a: ValkeyStateStore, b: ValkeyStateStore, eventually: Eventually,
                        tag: int) -> None:
    """a's counts and prefix writes still reach b, and both report up."""
    a.add_inflight(f"e{tag}", 3, 30)
    a.prefix_add(f"e{tag}", [tag, tag + 1], capacity=100)
    await a.sync()
    await eventually(lambda: b.prefix_match([tag, tag + 1]) == {f"e{tag}": 2},
                     f"prefix write {tag} reached b")
    await b.sync()
    assert b.inflight(f"e{tag}") == InFlight(3, 30)
    a.add_inflight(f"e{tag}", -3, -30)
    assert a.shared and b.shared
    assert all(not t.done() for t in a._tasks + b._tasks)
    assert up() == 1


POISONS: dict[str, list[tuple[str, bytes]]] = {
    # (source the rejection is counted under, the bytes written)
    "inflight": [("inflight", b'{"e1": "x"}'), ("inflight", b'.{"t": 1, "c": {"e1": [1]}}'),
                 ("inflight", b".[1, 2]"), ("inflight", os.urandom(64))],
    "publish": [("update", b'.{"r": "z", "p": [["e1", ["x"], 5]]}'),
                ("update", b'.{"r": "z", "p": 7}'), ("update", b"not json"),
                ("update", os.urandom(64))],
    "prefix": [("prefix", b"not-a-number"), ("prefix", b"-5"),
               ("prefix", b"99999999999999999999999"), ("prefix", os.urandom(16))],
}


@pytest.mark.parametrize("where", sorted(POISONS))
async def test_a_poisoned_value_is_rejected_counted_logged_and_sharing_goes_on(
        where: str, store_url: str, eventually: Eventually) -> None:
    raw = valkey.Valkey.from_url(store_url)
    a = await start(store_url, "a", secret=None)
    b = await start(store_url, "b", secret=None)
    late: ValkeyStateStore | None = None
    try:
        await eventually(lambda: a.shared and b.shared, "both joined")
        await still_sharing(a, b, eventually, 100)
        with capture_logs() as logs:
            for i, (source, poison) in enumerate(POISONS[where]):
                before = rejected(source)
                if where == "inflight":
                    raw.sadd(f"{NS}:replicas", f"fake{i}")
                    raw.set(f"{NS}:inflight:fake{i}", poison, px=60_000)
                    await b.sync()
                elif where == "publish":
                    raw.publish(f"{NS}:updates", poison)
                else:  # read when a replica (re)loads the shared index: a late joiner
                    raw.sadd(f"{NS}:prefix-endpoints", "e100")
                    raw.zadd(f"{NS}:prefix:e100", {poison: 1.0})
                    late = await start(store_url, f"late{i}", secret=None)
                    await eventually(lambda late=late: late.shared, "the late replica joined")
                    # Its good members were kept, the bad one dropped.
                    assert late.prefix_match([100, 101]) == {"e100": 2}
                    await late.close()
                    late = None
                await eventually(lambda s=source, n=before: rejected(s) > n,
                                 f"{where} poison {i} counted")
                await still_sharing(a, b, eventually, 200 + 10 * i)
                # Nothing of the poison reached the local view.
                assert b.inflight("e1") == InFlight(0, 0)
        warnings = [e for e in logs if e["event"] == "state store value rejected"]
        assert warnings and {e["source"] for e in warnings} == {POISONS[where][0][0]}
        # A replica started after the poison (still in the store) joins and shares.
        late = await start(store_url, "later", secret=None)
        await eventually(lambda: late is not None and late.shared, "a later replica joined")
        assert late.prefix_match([100, 101]) == {"e100": 2}
    finally:
        for store in (a, b, late):
            if store is not None:
                await store.close()  # never re-raises what the loops met
        raw.close()


async def test_health_gauge_follows_the_background_tasks(
        store_url: str, eventually: Eventually) -> None:
    a = await start(store_url, "a")
    try:
        await eventually(lambda: a.shared, "a joined")
        assert up() == 1
        a._tasks[1].cancel()  # the feed task is gone, whatever the reason
        await eventually(lambda: up() == 0, "the gauge dropped with the task")
        assert not a.shared
    finally:
        await a.close()


async def test_every_key_has_a_ttl(store_url: str, eventually: Eventually) -> None:
    a = await start(store_url, "a")
    try:
        a.add_inflight("e", 1, 1)
        a.prefix_add("e", [1, 2, 3], capacity=10)
        a.session_set("s1", "e")
        await a.sync()
        raw = valkey.Valkey.from_url(store_url)
        keys = raw.keys(f"{NS}:*")
        assert len(keys) == 5, keys  # replicas, inflight, prefix-endpoints, prefix, session
        assert {k: raw.pttl(k) > 0 for k in keys} == {k: True for k in keys}
        raw.close()
    finally:
        await a.close()


async def test_a_value_without_ttl_stops_counting(
        store_url: str, eventually: Eventually) -> None:
    """A replica's key left without TTL (or replayed) is refused once older than the TTL."""
    b = await start(store_url, "b", secret=None)
    raw = valkey.Valkey.from_url(store_url)
    try:
        old = orjson.dumps({"t": 1_000_000.0, "c": {"e": [50, 500]}})
        raw.sadd(f"{NS}:replicas", "ghost")
        raw.set(f"{NS}:inflight:ghost", b"." + old)  # no TTL
        before = rejected("inflight")
        await b.sync()
        assert b.inflight("e") == InFlight(0, 0)
        assert rejected("inflight") > before
    finally:
        raw.close()
        await b.close()


async def test_a_forged_replica_cannot_move_counts_or_prefix_matches(
        store_url: str, eventually: Eventually) -> None:
    a = await start(store_url, "a")
    b = await start(store_url, "b")
    raw = valkey.Valkey.from_url(store_url)
    try:
        await eventually(lambda: a.shared and b.shared, "both joined")
        a.add_inflight("e-real", 2, 20)
        await a.sync()
        real_blob = raw.get(f"{NS}:inflight:a")
        wrong = Codec(b"not-the-shared-secret!")
        unsigned = Codec(None)
        forged_counts = {"e-victim": [40, 40_000]}
        forgeries = {
            "unsigned": unsigned.seal_inflight(f"{NS}:inflight:f1", forged_counts),
            "wrong-key": wrong.seal_inflight(f"{NS}:inflight:f2", forged_counts),
            "copied": real_blob,  # a's own valid value under another name
        }
        before, before_update = rejected("inflight"), rejected("update")
        for i, blob in enumerate(forgeries.values()):
            raw.sadd(f"{NS}:replicas", f"f{i + 1}")
            raw.set(f"{NS}:inflight:f{i + 1}", blob, px=60_000)
        update = orjson.dumps({"r": "a", "p": [["e-victim", ["77", "78"], 100]],
                               "s": {"sess": wrong.seal_session("sess", "e-victim")}})
        raw.publish(f"{NS}:updates", unsigned.seal(f"{NS}:updates", update))
        raw.publish(f"{NS}:updates", wrong.seal(f"{NS}:updates", update))
        await b.sync()
        await eventually(lambda: rejected("update") >= before_update + 2, "forged updates refused")
        # Only a's real counts count; the forged ones and the copy moved nothing.
        assert b.inflight("e-real") == InFlight(2, 20)
        assert b.inflight("e-victim") == InFlight(0, 0)
        assert rejected("inflight") >= before + 3
        assert b.prefix_match([77, 78]) == {}
        assert b.session_get("sess") is None
        # A forged session key is refused when a replica loads the shared sessions.
        raw.set(f"{NS}:session:s2", wrong.seal_session("s2", "e-victim"), px=60_000)
        late = await start(store_url, "late")
        try:
            await eventually(lambda: late.shared, "late joined")
            assert late.session_get("s2") is None
        finally:
            await late.close()
        # The real replica still shares.
        await still_sharing(a, b, eventually, 500)
    finally:
        raw.close()
        await a.close()
        await b.close()
