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


# --- the other active-active replicas' counts (docs/active-active.md) -------------------


def test_other_replicas_requests_count_in_flight_and_their_new_picks_in_queue() -> None:
    v = view()
    v.apply_scrape(EndpointMetrics(waiting=1, updated_at=1.0))
    v.start_request(10)
    v.set_remote_inflight(3, 30)
    assert (v.inflight_requests, v.inflight_tokens, v.queue) == (4, 40, 1 + 1 + 3)
    # A scrape sent after the others' picks reflects them; our own finished request goes.
    v.begin_scrape()
    v.apply_scrape(EndpointMetrics(waiting=4, updated_at=2.0))
    v.end_request(10)
    assert (v.inflight_requests, v.inflight_tokens, v.queue) == (3, 30, 4)
    v.set_remote_inflight(5, 50)  # two more since that scrape
    assert v.queue == 6
    v.set_remote_inflight(0, 0)  # the other replica finished (or died)
    assert (v.inflight_requests, v.inflight_tokens, v.queue) == (0, 0, 4)


def test_own_release_never_eats_into_the_others_counts() -> None:
    v = view()
    v.set_remote_inflight(2, 20)
    v.end_request(10)  # a release for a request counted before a restart
    assert (v.inflight_requests, v.inflight_tokens) == (2, 20)


def test_inflight_producer_installs_the_others_counts_on_the_views() -> None:
    from epp.requestcontrol.plugins import InflightLoadProducer
    from epp.statestore import InFlight, MemoryStateStore
    from tests.epp.unit.test_director import store

    ds, shared = store(), MemoryStateStore()
    producer = InflightLoadProducer(store=shared, datastore=ds)
    a, b = ds.views()[:2]
    shared.set_remote({a.key: InFlight(2, 200)})  # what a pull from Valkey does
    assert (a.inflight_requests, a.remote_requests, b.inflight_requests) == (2, 2, 0)
    shared.set_remote({})
    assert a.inflight_requests == 0
    assert producer.store is shared


def test_the_handle_gives_every_stateful_plugin_the_same_store() -> None:
    from epp.config import build, parse_config
    from epp.requestcontrol.plugins import InflightLoadProducer
    from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
    from epp.statestore import MemoryStateStore

    shared = MemoryStateStore()
    rt = build(parse_config(None), state_store=shared)
    assert rt.handle.state_store is shared
    (inflight,) = rt.handle.find(InflightLoadProducer)
    (prefix,) = rt.handle.find(ApproxPrefixCacheProducer)
    assert inflight.store is shared and prefix.store is shared
    # Without one, each EPP gets a private store (nothing shared, as before).
    assert build(parse_config(None)).handle.state_store is not shared
