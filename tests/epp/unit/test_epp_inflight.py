"""EPP-side in-flight accounting: picks between scrapes raise the effective queue."""

from __future__ import annotations

from epp.datastore import Endpoint, EndpointMetrics, EndpointView


def view() -> EndpointView:
    return EndpointView(Endpoint("p-rank-0", "p", "default", "10.0.0.1", 8000, 0, {}))


def test_pick_after_scrape_raises_queue() -> None:
    v = view()
    v.apply_scrape(EndpointMetrics(waiting=2, updated_at=1.0))
    v.start_request()
    assert v.queue == 3


def test_scrape_sent_after_pick_absorbs_it() -> None:
    v = view()
    v.start_request()
    v.begin_scrape()
    v.apply_scrape(EndpointMetrics(waiting=1, updated_at=1.0))
    assert v.queue == 1


def test_pick_during_a_scrape_still_counts() -> None:
    v = view()
    v.begin_scrape()
    v.start_request()  # the server's answer was already being computed
    v.apply_scrape(EndpointMetrics(waiting=0, updated_at=1.0))
    assert v.queue == 1


def test_finished_request_stops_counting() -> None:
    v = view()
    v.start_request(10)
    v.end_request(10)
    assert (v.queue, v.inflight_requests, v.inflight_tokens) == (0, 0, 0)


def test_end_without_start_never_goes_negative() -> None:
    v = view()
    v.end_request(5)
    assert (v.inflight_requests, v.inflight_tokens) == (0, 0)
