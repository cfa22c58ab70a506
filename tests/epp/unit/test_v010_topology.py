"""``topology-extractor``, ``topology-affinity-filter``, ``topology-affinity-scorer`` and
``disagg-profile-handler``'s ``stageOrder`` with the ``peer-endpoint`` it publishes."""

from __future__ import annotations

from typing import Any

import pytest

from epp.config import build
from epp.config.loader import ConfigError, parse_config
from epp.datalayer.endpoint_events import EndpointEvent, EventKind
from epp.datalayer.topology import PEER_ENDPOINT, TopologyExtractor
from epp.datastore import EndpointView
from epp.scheduling import LLMRequest

ROLE = "llm-d.ai/role"
HOST, RACK, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/rack", \
    "topology.kubernetes.io/zone"

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: topology-extractor
- type: prefill-filter
- type: decode-filter
- type: topology-affinity-filter
  parameters: {minAffinity: %(floor)s}
- type: topology-affinity-scorer
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters: %(handler)s
- type: max-score-picker
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, %(prefill)s {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, %(decode)s {pluginRef: max-score-picker}]
"""


def runtime(floor: str = "rack", handler: str = "{deciders: {prefill: always-disagg-pd-decider}}",
            prefill: str = "{pluginRef: topology-affinity-filter}, "
                           "{pluginRef: topology-affinity-scorer},",
            decode: str = "") -> Any:
    return build(parse_config(CONFIG % {"floor": floor, "handler": handler,
                                        "prefill": prefill, "decode": decode}))


def located(rt: Any, view: EndpointView) -> EndpointView:
    for extractor in rt.handle.find(TopologyExtractor):
        extractor.on_endpoint_event(EndpointEvent(EventKind.ADDED, view.endpoint, view))
    return view


def req() -> LLMRequest:
    return LLMRequest(request_id="r", target_model="m")


def fleet(rt: Any, make_view) -> dict[str, EndpointView]:
    """decode d on host h1/rack r1/zone z1; prefill pods at each distance from it."""
    spots = {"d": ("decode", "h1", "r1", "z1"), "same-host": ("prefill", "h1", "r1", "z1"),
             "same-rack": ("prefill", "h2", "r1", "z1"), "same-zone": ("prefill", "h3", "r2", "z1"),
             "far": ("prefill", "h4", "r3", "z2")}
    return {k: located(rt, make_view(i + 1, labels={ROLE: role, HOST: h, RACK: r, ZONE: z}))
            for i, (k, (role, h, r, z)) in enumerate(spots.items())}


def test_filter_keeps_prefill_pods_within_min_affinity_of_the_decode_pick(make_view) -> None:
    rt = runtime(floor="rack", prefill="{pluginRef: topology-affinity-filter},")
    v = fleet(rt, make_view)
    for _ in range(5):
        prefill = rt.scheduler.schedule(req(), list(v.values())).results["prefill"]
        assert {e.key for e in prefill.candidates} == {v["same-host"].key, v["same-rack"].key}


def test_filter_fails_open_when_no_candidate_is_close_enough(make_view) -> None:
    rt = runtime(floor="host", prefill="{pluginRef: topology-affinity-filter},")
    v = fleet(rt, make_view)
    cands = [v["d"], v["same-zone"], v["far"]]
    prefill = rt.scheduler.schedule(req(), cands).results["prefill"]
    assert len(prefill.candidates) == 2


def test_filter_fails_open_without_peer_and_drops_candidates_without_topology(
        make_view) -> None:
    rt = runtime()
    f = rt.handle.plugin("topology-affinity-filter", object)
    v = fleet(rt, make_view)
    bare = make_view(9, labels={ROLE: "prefill"})
    assert list(f.filter(req(), [v["far"], bare])) == [v["far"], bare]  # no peer
    r = req()
    r.plugin_state[PEER_ENDPOINT] = v["d"]
    assert list(f.filter(r, [v["same-rack"], bare])) == [v["same-rack"]]


def test_scorer_follows_upstreams_curve(make_view) -> None:
    rt = runtime()
    s = rt.handle.plugin("topology-affinity-scorer", object)
    v = fleet(rt, make_view)
    r = req()
    assert list(s.score(r, [v["same-host"], v["far"]])) == [0.0, 0.0]  # no peer: 0
    r.plugin_state[PEER_ENDPOINT] = v["d"]
    order = ["same-host", "same-rack", "same-zone", "far"]
    assert list(s.score(r, [v[k] for k in order])) == [1.0, 0.2, 0.05, 0.0]


def test_scorer_makes_the_prefill_pick_the_closest_pod(make_view) -> None:
    rt = runtime(prefill="{pluginRef: topology-affinity-scorer},")
    v = fleet(rt, make_view)
    result = rt.scheduler.schedule(req(), list(v.values()))
    assert result.results["prefill"].picked[0] is v["same-host"]
    assert result.primary_profile == "decode" and result.endpoints[0] is v["d"]


def test_a_missing_value_never_matches(make_view) -> None:
    rt = runtime()
    s = rt.handle.plugin("topology-affinity-scorer", object)
    peer = located(rt, make_view(1, labels={ROLE: "decode", ZONE: "z1"}))
    other = located(rt, make_view(2, labels={ROLE: "prefill", ZONE: "z1"}))
    r = req()
    r.plugin_state[PEER_ENDPOINT] = peer
    assert list(s.score(r, [other])) == [0.05]  # zone only: empty hosts do not match


def test_extractor_labels_are_configurable_and_a_notification_source_feeds_it(
        make_view) -> None:
    from epp.datalayer import EndpointNotificationSource
    from epp.datalayer.topology import topology_of

    rt = build(parse_config("plugins:\n- type: topology-extractor\n  parameters: "
                            "{hostname: node, rack: rack}\n- type: max-score-picker\n"))
    view = located(rt, make_view(1, labels={"node": "n7", "rack": "r9"}))
    topo = topology_of(view, "topology-extractor")
    assert topo is not None and (topo.hostname, topo.rack, topo.zone) == ("n7", "r9", "")
    assert topology_of(located(rt, make_view(2)), "topology-extractor") is None
    fed = [s for s in rt.data_sources if isinstance(s, EndpointNotificationSource)]
    assert fed and isinstance(fed[0].extractors[0], TopologyExtractor)


def test_prefill_first_runs_prefill_then_decode_near_it(make_view) -> None:
    rt = runtime(handler="{stageOrder: prefill-first}", prefill="",
                 decode="{pluginRef: topology-affinity-scorer},")
    labels = {"p": ("prefill", "h1"), "d-far": ("decode", "h9"), "d-near": ("decode", "h1")}
    v = {k: located(rt, make_view(i + 1, labels={ROLE: role, HOST: h}))
         for i, (k, (role, h)) in enumerate(labels.items())}
    result = rt.scheduler.schedule(req(), list(v.values()))
    assert list(result.results) == ["prefill", "decode"]
    assert result.endpoints[0] is v["d-near"] and result.primary_profile == "decode"


def test_stage_order_is_checked() -> None:
    with pytest.raises(ConfigError, match="stageOrder"):
        runtime(handler="{stageOrder: encode-first}")


def test_topology_consumers_refuse_an_unknown_producer() -> None:
    with pytest.raises(ConfigError, match="no plugin named 'nope'"):
        build(parse_config("plugins:\n- type: topology-affinity-scorer\n  parameters: "
                           "{topologyProducerName: nope}\n"))
