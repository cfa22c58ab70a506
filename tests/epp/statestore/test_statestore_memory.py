"""The in-process store: a single replica's own in-flight counts, prefix index and sessions."""

from __future__ import annotations

from epp.statestore import InFlight, MemoryStateStore, open_store


class Clock:
    """A hand-moved clock for the session TTL."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_memory_url_opens_the_in_process_store() -> None:
    store = open_store("memory://")
    assert isinstance(store, MemoryStateStore)
    assert not store.shared


def test_inflight_adds_and_releases() -> None:
    s = MemoryStateStore()
    s.add_inflight("a", 1, 100)
    s.add_inflight("a", 1, 50)
    s.add_inflight("a", -1, -100)
    assert s.inflight("a") == InFlight(1, 50)
    assert s.inflight("b") == InFlight(0, 0)


def test_inflight_never_goes_below_idle() -> None:
    s = MemoryStateStore()
    s.add_inflight("a", -1, -10)
    assert s.inflight("a") == InFlight(0, 0)
    assert "a" not in s.own


def test_inflight_includes_other_replicas_counts() -> None:
    s = MemoryStateStore()
    s.remote = {"a": InFlight(3, 30)}
    s.add_inflight("a", 1, 5)
    assert s.inflight("a") == InFlight(4, 35)


def test_prefix_match_counts_leading_blocks() -> None:
    s = MemoryStateStore()
    s.prefix_add("a", [1, 2, 3], capacity=10)
    s.prefix_add("b", [1], capacity=10)
    assert s.prefix_match([1, 2, 9]) == {"a": 2, "b": 1}


def test_prefix_capacity_evicts_least_recently_used() -> None:
    s = MemoryStateStore()
    s.prefix_add("a", [1, 2], capacity=3)
    s.prefix_add("a", [1], capacity=3)  # 1 is now the most recent
    s.prefix_add("a", [7, 8], capacity=3)
    assert s.prefix_match([2]) == {}
    assert s.prefix_match([1]) == {"a": 1}


def test_prefix_retain_forgets_endpoints_that_left() -> None:
    s = MemoryStateStore()
    s.prefix_add("a", [1], capacity=10)
    s.prefix_add("b", [1], capacity=10)
    s.prefix_retain(frozenset({"b"}))
    assert s.prefix_match([1]) == {"b": 1}


def test_session_expires_after_its_ttl() -> None:
    clock = Clock()
    s = MemoryStateStore(session_ttl=10, clock=clock)
    s.session_set("user-1", "10.0.0.1:8000")
    clock.now += 9.9
    assert s.session_get("user-1") == "10.0.0.1:8000"
    clock.now += 0.2
    assert s.session_get("user-1") is None


def test_session_map_is_bounded() -> None:
    s = MemoryStateStore(max_sessions=2)
    for key in ("a", "b", "c"):
        s.session_set(key, key)
    assert [s.session_get(k) for k in ("a", "b", "c")] == [None, "b", "c"]
