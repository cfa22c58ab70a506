"""llm-d-router v0.10 scheduling plugins: utilization-filter, session-affinity-filter,
header-label-affinity-scorer, header-profile-handler (behaviour through the registry, with
the parameters and defaults upstream documents)."""

from __future__ import annotations

from typing import Any

import pytest

from epp.config import build
from epp.config.builtins import builtin_registry
from epp.config.loader import ConfigError, parse_config
from epp.datastore import EndpointView
from epp.requestcontrol.plugin import Response
from epp.scheduling import LLMRequest
from epp.scheduling.result import ProfileResult, SchedulingResult
from epp.scheduling.scheduler import NoEndpointPicked
from shared.plugins import PluginError


def plugin(type_name: str, **params: Any) -> Any:
    return builtin_registry().create(type_name, "", params)


def req(headers: dict[str, str] | None = None, **state: Any) -> LLMRequest:
    r = LLMRequest(request_id="r", target_model="m", headers=headers or {})
    r.plugin_state.update(state)
    return r


def picked(view: EndpointView, profile: str = "default") -> SchedulingResult:
    return SchedulingResult({profile: ProfileResult(profile, [view])}, profile)


# -- utilization-filter ----------------------------------------------------------------------


def test_utilization_filter_drops_an_endpoint_past_any_cap(make_view) -> None:
    f = plugin("utilization-filter", conditions=[
        {"metric": "running-requests", "maxValue": 40}, {"metric": "waiting-queue", "maxValue": 0},
        {"metric": "kv-cache-utilization", "maxValue": 0.8}])
    ok, busy, queued, full = (make_view(1, running=40), make_view(2, running=41),
                              make_view(3, waiting=1), make_view(4, kv=0.81))
    assert list(f.filter(req(), [ok, busy, queued, full])) == [ok]


def test_utilization_filter_active_requests_reads_the_inflight_count(make_view) -> None:
    a, b = make_view(1), make_view(2)
    for _ in range(3):
        b.start_request()
    f = plugin("utilization-filter", conditions=[{"metric": "active-requests", "maxValue": 2}])
    assert list(f.filter(req(), [a, b])) == [a]


def test_utilization_filter_fallback_on_empty_returns_every_candidate(make_view) -> None:
    views = [make_view(1, waiting=5), make_view(2, waiting=6)]
    strict = plugin("utilization-filter", conditions=[{"metric": "waiting-queue", "maxValue": 0}])
    lenient = plugin("utilization-filter", fallbackOnEmpty=True,
                     conditions=[{"metric": "waiting-queue", "maxValue": 0}])
    assert list(strict.filter(req(), views)) == []
    assert list(lenient.filter(req(), views)) == views


@pytest.mark.parametrize(("params", "why"), [
    ({}, "at least one condition"),
    ({"conditions": [{"metric": "waiting-queue", "maxValue": -1}]}, "non-negative"),
    ({"conditions": [{"metric": "kv-cache-utilization", "maxValue": 1.5}]}, "at most 1"),
    ({"conditions": [{"metric": "gpu-temp", "maxValue": 1}]}, "must be one of"),
    ({"conditions": [{"metric": "waiting-queue", "maxValue": 1}],
      "inFlightLoadProducerName": "nope"}, "no plugin named 'nope'"),
])
def test_utilization_filter_refuses_bad_parameters(params: dict[str, Any], why: str) -> None:
    with pytest.raises(PluginError, match=why):
        plugin("utilization-filter", **params)


# -- session-affinity-filter -------------------------------------------------------------


def test_session_filter_token_pins_the_request_to_the_endpoint_that_served_it(
        make_view) -> None:
    f = plugin("session-affinity-filter")
    a, b = make_view(1), make_view(2)
    first = req()
    f.pre_request(first, picked(b))
    response = Response("r")
    f.response_received(first, response, b)
    token = response.set_headers["x-session-token"]
    assert list(f.filter(req({"x-session-token": token}), [a, b])) == [b]
    # gone from the candidates, a forged or absent token: every candidate, never none
    assert list(f.filter(req({"x-session-token": token}), [a])) == [a]
    assert list(f.filter(req({"x-session-token": "A" * 32}), [a, b])) == [a, b]
    assert list(f.filter(req(), [a, b])) == [a, b]


def test_session_filter_understands_the_scorer_token(make_view) -> None:
    scorer = plugin("session-affinity-scorer")
    f = plugin("session-affinity-filter")
    a, b = make_view(1), make_view(2)
    assert list(f.filter(req({"x-session-token": scorer.token(a)}), [a, b])) == [a]


def test_session_filter_profile_name_writes_that_profile_pick(make_view) -> None:
    f = plugin("session-affinity-filter", profileName="prefill",
               encodedEndpointHeaderConfig={"header": "X-Session-Token-Prefill"})
    prefill, decode = make_view(1), make_view(2)
    request = req()
    f.pre_request(request, SchedulingResult(
        {"prefill": ProfileResult("prefill", [prefill]),
         "decode": ProfileResult("decode", [decode])}, "decode"))
    response = Response("r")
    f.response_received(request, response, decode)
    token = response.set_headers["x-session-token-prefill"]
    assert list(f.filter(req({"x-session-token-prefill": token}), [prefill, decode])) == [
        prefill]


def test_session_id_binds_then_pins_and_moves_only_when_its_endpoint_left(make_view) -> None:
    f = plugin("session-affinity-filter", strategy="session_id")
    a, b = make_view(1), make_view(2)
    first = req({"x-session-id": "s1"})
    assert list(f.filter(first, [a, b])) == [a, b]  # unbound: no preference
    f.pre_request(first, picked(b))
    second = req({"x-session-id": "s1"})
    assert list(f.filter(second, [a, b])) == [b]
    f.pre_request(second, picked(b))
    third = req({"x-session-id": "s1"})
    assert list(f.filter(third, [a])) == [a]  # b left: pass through, then rebind
    f.pre_request(third, picked(a))
    assert list(f.filter(req({"x-session-id": "s1"}), [a, b])) == [a]
    assert response_headers_of(f, a) == {}  # session_id writes nothing back


def response_headers_of(f: Any, view: EndpointView) -> dict[str, str]:
    response = Response("r")
    f.response_received(req(), response, view)
    return dict(response.set_headers)


def test_session_id_reads_sources_in_order_header_then_attribute(make_view) -> None:
    f = plugin("session-affinity-filter", strategy="session_id", sessionIdConfig={
        "sources": [{"header": "x-session-id"}, {"attribute": "agent-identity"}]})
    a, b = make_view(1), make_view(2)
    f.pre_request(req(**{"agent-identity": "agent-7"}), picked(a))
    assert list(f.filter(req(**{"agent-identity": "agent-7"}), [a, b])) == [a]
    f.pre_request(req({"x-session-id": "hdr"}, **{"agent-identity": "agent-7"}), picked(b))
    assert list(f.filter(req({"x-session-id": "hdr"}), [a, b])) == [b]


def test_session_id_bindings_expire_after_the_ttl(make_view) -> None:
    now = [0.0]
    cls = builtin_registry().get("session-affinity-filter")
    params = builtin_registry().create(
        "session-affinity-filter", "", {"strategy": "session_id", "sessionIdConfig": {
            "evictionTtlSeconds": 5, "evictionSweepSeconds": 1}}).params
    f = cls("f", params, clock=lambda: now[0])
    a, b = make_view(1), make_view(2)
    f.pre_request(req({"x-session-id": "s"}), picked(b))
    now[0] = 4.0
    f.pre_request(req({"x-session-id": "other"}), picked(a))  # sweeps: s is 4 s old
    assert list(f.filter(req({"x-session-id": "s"}), [a, b])) == [b]
    now[0] = 10.0
    f.pre_request(req({"x-session-id": "other"}), picked(a))  # sweeps: s is 10 s old
    assert list(f.filter(req({"x-session-id": "s"}), [a, b])) == [a, b]


@pytest.mark.parametrize(("params", "why"), [
    ({"strategy": "cookie"}, "must be one of"),
    ({"strategy": "session_id", "sessionIdConfig": {"sources": [{}]}}, "exactly one"),
    ({"strategy": "session_id", "sessionIdConfig": {
        "sources": [{"header": "h", "attribute": "a"}]}}, "exactly one"),
    ({"sessionIdConfig": {"evictionTtlSeconds": 0}}, "evictionTtlSeconds"),
])
def test_session_filter_refuses_bad_parameters(params: dict[str, Any], why: str) -> None:
    with pytest.raises(PluginError, match=why):
        plugin("session-affinity-filter", **params)


# -- header-label-affinity-scorer -------------------------------------------------------------


def test_header_label_affinity_scores_the_matching_label_one(make_view) -> None:
    s = plugin("header-label-affinity-scorer", headerName="X-Disagg-Slice",
               labelKey="disaggregatedset.x-k8s.io/slice")
    zero = make_view(1, labels={"disaggregatedset.x-k8s.io/slice": "0"})
    one = make_view(2, labels={"disaggregatedset.x-k8s.io/slice": "1"})
    bare = make_view(3)
    assert list(s.score(req({"x-disagg-slice": "1"}), [zero, one, bare])) == [0, 1, 0]
    assert list(s.score(req({"x-disagg-slice": "7"}), [zero, one, bare])) == [0, 0, 0]
    assert list(s.score(req(), [zero, one, bare])) == [0, 0, 0]


def test_header_label_affinity_requires_both_parameters() -> None:
    with pytest.raises(PluginError, match="labelKey is required"):
        plugin("header-label-affinity-scorer", headerName="x")
    with pytest.raises(PluginError, match="headerName is required"):
        plugin("header-label-affinity-scorer", labelKey="x")


# -- header-profile-handler -------------------------------------------------------------

STAGES = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: header-profile-handler%s}
- {type: label-selector-filter, name: only-prefill, parameters: {matchLabels: {role: prefill}}}
- {type: label-selector-filter, name: only-decode, parameters: {matchLabels: {role: decode}}}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: only-prefill}]
- name: decode
  plugins: [{pluginRef: only-decode}]
"""


def stages(params: str = "") -> Any:
    return build(parse_config(STAGES % params)).scheduler


def test_header_profile_handler_runs_the_profile_the_header_names(make_view) -> None:
    p, d = make_view(1, labels={"role": "prefill"}), make_view(2, labels={"role": "decode"})
    result = stages().schedule(req({"epp-profile": "prefill"}), [p, d])
    assert list(result.results) == ["prefill"] and result.endpoints == [p]
    result = stages().schedule(req(), [p, d])  # missing: defaultProfile decode
    assert list(result.results) == ["decode"] and result.endpoints == [d]


def test_header_profile_handler_custom_header_and_default(make_view) -> None:
    p, d = make_view(1, labels={"role": "prefill"}), make_view(2, labels={"role": "decode"})
    s = stages(", parameters: {headerName: X-Stage, defaultProfile: prefill}")
    assert s.schedule(req(), [p, d]).endpoints == [p]
    assert s.schedule(req({"x-stage": "decode"}), [p, d]).endpoints == [d]


def test_header_profile_handler_unknown_profile_is_429_not_the_default(make_view) -> None:
    p, d = make_view(1, labels={"role": "prefill"}), make_view(2, labels={"role": "decode"})
    with pytest.raises(NoEndpointPicked, match="no scheduling profile"):
        stages().schedule(req({"epp-profile": "encode"}), [p, d])


def test_header_profile_handler_single_profile_always_runs(make_view) -> None:
    one = STAGES.replace("- name: prefill\n  plugins: [{pluginRef: only-prefill}]\n", "")
    s = build(parse_config(one % "")).scheduler
    d = make_view(2, labels={"role": "decode"})
    assert s.schedule(req({"epp-profile": "prefill"}), [d]).endpoints == [d]


def test_v010_plugins_stop_a_bad_config_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="maxValue"):
        build(parse_config("""\
plugins:
- type: utilization-filter
  parameters: {conditions: [{metric: waiting-queue, maxValue: -2}]}
"""))


def test_session_scorer_session_id_strategy_prefers_the_bound_endpoint(make_view) -> None:
    s = plugin("session-affinity-scorer", strategy="session_id",
               sessionIdConfig={"sources": [{"attribute": "agent-identity"}]})
    a, b = make_view(1), make_view(2)
    first = req(**{"agent-identity": "agent-1"})
    assert list(s.score(first, [a, b])) == [0, 0]
    s.pre_request(first, picked(a))
    assert list(s.score(req(**{"agent-identity": "agent-1"}), [a, b])) == [1, 0]
    assert list(s.score(req(**{"agent-identity": "agent-2"}), [a, b])) == [0, 0]


def test_session_scorer_custom_header_round_trip(make_view) -> None:
    s = plugin("session-affinity-scorer", encodedEndpointHeaderConfig={"header": "x-sticky"})
    a, b = make_view(1), make_view(2)
    response = Response("r")
    s.response_received(req(), response, b)
    assert list(s.score(req({"x-sticky": response.set_headers["x-sticky"]}), [a, b])) == [0, 1]
