"""The live store: atomic replace, candidates, in-flight accounting."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epp.datastore import Datastore, EndpointMetrics, Snapshot, build_snapshot, parse_object

Raw = Callable[..., dict[str, Any]]


def snap(raw_pool: Raw, raw_pod: Raw, *names: str) -> Snapshot:
    docs = [raw_pool()] + [raw_pod(n, f"10.0.0.{i + 1}") for i, n in enumerate(names)]
    objs = [parse_object(d) for d in docs]
    return build_snapshot([o for o in objs if o], pool_name=None, pool_namespace="default")


def test_replace_marks_the_store_synced(raw_pool: Raw, raw_pod: Raw) -> None:
    ds = Datastore()
    assert not ds.is_synced
    ds.replace(snap(raw_pool, raw_pod, "a"))
    assert ds.is_synced


def test_endpoint_kept_across_replace_keeps_its_counters(raw_pool: Raw, raw_pod: Raw) -> None:
    ds = Datastore()
    ds.replace(snap(raw_pool, raw_pod, "a"))
    ds.candidates()[0].start_request(100)
    ds.replace(snap(raw_pool, raw_pod, "a", "b"))
    view = ds.view("10.0.0.1:8000")
    assert view is not None and view.inflight_tokens == 100


def test_removed_endpoint_leaves_candidates(raw_pool: Raw, raw_pod: Raw) -> None:
    ds = Datastore()
    ds.replace(snap(raw_pool, raw_pod, "a", "b"))
    ds.replace(snap(raw_pool, raw_pod, "a"))
    assert [v.key for v in ds.candidates()] == ["10.0.0.1:8000"]


def test_endpoint_never_read_failing_scrapes_leaves_candidates_until_success(
    raw_pool: Raw, raw_pod: Raw
) -> None:
    ds = Datastore(failure_threshold=3)
    ds.replace(snap(raw_pool, raw_pod, "a"))
    view = ds.views()[0]
    for _ in range(3):
        ds.record_scrape_failure(view)
    assert ds.candidates() == ()
    ds.record_scrape(view, EndpointMetrics(updated_at=1.0))
    assert ds.candidates() == (view,)


def test_two_failures_below_threshold_keep_the_endpoint(raw_pool: Raw, raw_pod: Raw) -> None:
    ds = Datastore(failure_threshold=3)
    ds.replace(snap(raw_pool, raw_pod, "a"))
    view = ds.views()[0]
    ds.record_scrape_failure(view)
    ds.record_scrape_failure(view)
    assert ds.candidates() == (view,)


def test_read_endpoint_failing_scrapes_stays_a_candidate_on_its_last_metrics(
    raw_pool: Raw, raw_pod: Raw
) -> None:
    ds = Datastore(failure_threshold=3)
    ds.replace(snap(raw_pool, raw_pod, "a"))
    view = ds.views()[0]
    ds.record_scrape(view, EndpointMetrics(waiting=4, updated_at=1.0))
    for _ in range(10):
        ds.record_scrape_failure(view)
    assert ds.candidates() == (view,) and view.metrics.waiting == 4


def test_read_endpoint_whose_server_refuses_leaves_candidates_until_success(
    raw_pool: Raw, raw_pod: Raw
) -> None:
    ds = Datastore(failure_threshold=3)
    ds.replace(snap(raw_pool, raw_pod, "a"))
    view = ds.views()[0]
    ds.record_scrape(view, EndpointMetrics(updated_at=1.0))
    ds.record_scrape_failure(view)
    ds.record_scrape_failure(view)
    assert ds.record_scrape_failure(view, refused=True)
    assert ds.candidates() == ()
    ds.record_scrape(view, EndpointMetrics(updated_at=2.0))
    assert ds.candidates() == (view,)


def test_listener_sees_each_new_snapshot(raw_pool: Raw, raw_pod: Raw) -> None:
    ds = Datastore()
    seen: list[int] = []
    ds.subscribe(lambda s: seen.append(len(s.endpoints)))
    ds.replace(snap(raw_pool, raw_pod, "a"))
    ds.replace(snap(raw_pool, raw_pod, "a", "b"))
    assert seen == [1, 2]
