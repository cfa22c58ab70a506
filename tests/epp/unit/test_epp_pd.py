"""P/D scheduling: role filters, deciders, the disaggregated profile handlers and the
``x-prefiller-host-port`` they set, built from configs as the EPP builds them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit.manifests import pool_manifests
from epp.config import ConfigError, Runtime, build, load_config_file, parse_config
from epp.datastore import Datastore, EndpointMetrics, EndpointView
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.requestcontrol.plugin import Response
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from epp.testing import PluginHarness, endpoint, request
from modelserver.pd import PREFILLER_HEADER, ROLE_LABEL
from shared.plugins import PluginError

# llm-d's deploy/config/pd-epp-config.yaml, as documented (written here, not copied)
LLMD_PD = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters: {maxPrefixBlocksToMatch: 256, lruCapacityPerServer: 31250}
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: %d}
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: prefix-based-pd-decider}
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
"""

PROFILES = """\
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]
"""


def role(i: int, value: str | None, **kw: int) -> EndpointView:
    return endpoint(i, labels={ROLE_LABEL: value} if value else {}, **kw)


@dataclass
class Routed:
    result: SchedulingResult

    @property
    def decode(self) -> str:
        return self.result.destination

    @property
    def prefiller(self) -> str | None:
        return self.result.extra_headers.get(PREFILLER_HEADER)


def route(rt: Runtime, req: LLMRequest, pool: Sequence[EndpointView]) -> Routed:
    """What the director does around the scheduler: producers, schedule, pre-request."""
    for producer in rt.producers:
        producer.produce(req, pool)
    result = rt.scheduler.schedule(req, pool)
    for plugin in rt.pre_request:
        plugin.pre_request(req, result)
    return Routed(result)


def runtime(text: str) -> Runtime:
    return build(parse_config(text))


def pool() -> list[EndpointView]:
    """Two decode and two prefill endpoints; the first of each has the shorter queue (fresh
    per call: routing counts requests in flight on the endpoint objects)."""
    return [role(1, "decode"), role(2, "decode", waiting=3), role(3, "prefill"),
            role(4, "prefill", waiting=2)]


# -- filters ------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "prefill", "decode"), [
    ("prefill", True, False), ("decode", False, True), ("both", True, True),
    ("prefill-decode", True, True), ("encode-prefill", True, False),
    ("encode-prefill-decode", True, True), ("encode", False, False), (None, False, True),
])
def test_role_filters_follow_llm_d_role_label(value: str | None, prefill: bool,
                                              decode: bool) -> None:
    v = role(1, value)
    assert bool(PluginHarness.of("prefill-filter").filter([v])) is prefill
    assert bool(PluginHarness.of("decode-filter").filter([v])) is decode


DATA = Path(__file__).parent.parent / "data"
LLMD_FILES = ["llm-d-pd-epp-config.yaml", "llm-d-sim-pd-epp-config.yaml",
              "llm-d-pd-profile-handler-epp-config.yaml"]


@pytest.mark.parametrize("name", LLMD_FILES)
def test_llm_d_pd_config_files_load_and_route(name: str) -> None:
    rt = build(load_config_file(DATA / name))
    long = route(rt, request("x" * 400), pool())  # 100 tokens > nonCachedTokens 16
    assert (long.decode, long.prefiller) == ("10.0.0.1:8000", "10.0.0.3:8000")
    short = route(rt, request("y" * 40), pool())  # 10 tokens
    assert (short.decode, short.prefiller) == ("10.0.0.1:8000", None)


# -- deciders -----------------------------------------------------------------------------

def test_llm_d_pd_config_disaggregates_a_long_uncached_prompt() -> None:
    rt = runtime(LLMD_PD % 256)
    r = route(rt, request("x" * 4000), pool())  # 1,000 tokens, nothing cached
    assert r.decode == "10.0.0.1:8000"
    assert r.prefiller == "10.0.0.3:8000"  # the prefill pod with the shorter queue


def test_short_prompt_is_decoded_without_a_prefiller() -> None:
    rt = runtime(LLMD_PD % 256)
    r = route(rt, request("x" * 1000), pool())  # 250 tokens < 256
    assert r.decode == "10.0.0.1:8000"
    assert r.prefiller is None
    assert set(r.result.results) == {"decode"}


def test_prefix_decider_counts_only_the_uncached_part_on_the_decode_pod() -> None:
    rt = runtime(LLMD_PD % 256)
    shared = "s" * 3200  # 800 tokens, cached on the decode pod after the first request
    assert route(rt, request(shared + "a" * 400), pool()).prefiller is not None
    again = route(rt, request(shared + "b" * 400), pool())  # 100 new tokens + partial block
    assert again.decode == "10.0.0.1:8000"
    assert again.prefiller is None
    fresh = route(rt, request("t" * 3200 + "b" * 400), pool())
    assert fresh.prefiller is not None


def test_non_cached_tokens_zero_never_disaggregates() -> None:
    rt = runtime(LLMD_PD % 0)
    assert route(rt, request("x" * 40_000), pool()).prefiller is None


def test_non_cached_tokens_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="nonCachedTokens cannot be negative"):
        runtime(LLMD_PD % -1)


def test_prefix_decider_without_a_prefix_plugin_gets_the_default_producer() -> None:
    """llm-d-router v0.10 creates the approx-prefix-cache-producer the decider reads when
    the config has none (its sim-e-p-d config relies on it)."""
    text = """\
plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 8}
- type: disagg-profile-handler
  parameters: {deciders: {prefill: prefix-based-pd-decider}}
""" + PROFILES
    rt = runtime(text)
    assert [p.type_name for p in rt.producers if p.type_name == "approx-prefix-cache-producer"
            ] == ["approx-prefix-cache-producer"]
    r = route(rt, request("x" * 400), pool())  # 100 uncached tokens >= 8
    assert r.prefiller == "10.0.0.3:8000"


ALWAYS = """\
plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: always-disagg-pd-decider
- type: %s
  parameters: %s
""" + PROFILES


def test_always_decider_disaggregates_even_a_tiny_prompt() -> None:
    rt = runtime(ALWAYS % ("disagg-profile-handler",
                           "{deciders: {prefill: always-disagg-pd-decider}}"))
    r = route(rt, request("hi"), pool())
    assert (r.decode, r.prefiller) == ("10.0.0.1:8000", "10.0.0.3:8000")


def test_without_a_decider_nothing_is_disaggregated() -> None:
    rt = runtime(ALWAYS % ("disagg-profile-handler", "{}"))
    assert route(rt, request("x" * 9000), pool()).prefiller is None


def test_no_prefill_endpoint_means_decode_locally() -> None:
    rt = runtime(ALWAYS % ("disagg-profile-handler",
                           "{deciders: {prefill: always-disagg-pd-decider}}"))
    r = route(rt, request("hi"), [role(1, "decode"), role(2, None)])
    assert r.decode in ("10.0.0.1:8000", "10.0.0.2:8000")
    assert r.prefiller is None


def test_no_decode_endpoint_is_a_429_and_no_prefill_runs() -> None:
    rt = runtime(ALWAYS % ("disagg-profile-handler",
                           "{deciders: {prefill: always-disagg-pd-decider}}"))
    with pytest.raises(Exception, match="rejected by decode-filter") as e:
        route(rt, request("hi"), [role(3, "prefill")])
    assert getattr(e.value, "status", None) == 429


# -- handler parameters (llm-d's shapes) ----------------------------------------------------

def test_pd_profile_handler_older_name_and_flat_parameters() -> None:
    rt = runtime(ALWAYS % ("pd-profile-handler",
                           "{deciderPluginName: always-disagg-pd-decider}"))
    r = route(rt, request("hi"), pool())
    assert r.prefiller == "10.0.0.3:8000"


def test_disagg_handler_accepts_llm_d_flat_form() -> None:
    rt = runtime(ALWAYS % ("disagg-profile-handler",
                           "{deciderPluginName: always-disagg-pd-decider}"))
    assert route(rt, request("hi"), pool()).prefiller == "10.0.0.3:8000"


def test_custom_profile_names() -> None:
    text = ALWAYS.replace("name: prefill", "name: p").replace("name: decode", "name: d")
    rt = runtime(text % ("disagg-profile-handler",
                         "{profiles: {decode: d, prefill: p}, "
                         "deciders: {prefill: always-disagg-pd-decider}}"))
    r = route(rt, request("hi"), pool())
    assert (r.decode, r.prefiller) == ("10.0.0.1:8000", "10.0.0.3:8000")


@pytest.mark.parametrize(("kind", "params", "error"), [
    ("disagg-profile-handler", "{deciders: {prefill: nope}}", "no plugin named 'nope'"),
    ("disagg-profile-handler", "{deciders: {prefill: queue-scorer}}", "is not a PDDecider"),
    ("disagg-profile-handler", "{deciders: {encode: always-disagg-pd-decider}}",
     "no scheduling profile named 'encode'"),
    ("disagg-profile-handler", "{profiles: {decode: dec}}", "no scheduling profile named 'dec'"),
    ("disagg-profile-handler",
     "{decodeProfile: decode, deciders: {prefill: always-disagg-pd-decider}}", "cannot mix"),
    ("pd-profile-handler", "{deciderPluginName: always-disagg-pd-decider, primaryPort: 8000}",
     "primaryPort"),
    ("pd-profile-handler", "{deciderPluginName: always-disagg-pd-decider, "
                           "prefixPluginName: missing}", "prefixPluginName"),
    ("pd-profile-handler", "{}", "no plugin named 'prefix-based-pd-decider'"),
])
def test_bad_handler_parameters_are_config_errors(kind: str, params: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        runtime(ALWAYS % (kind, params))


def test_a_profile_the_handler_never_runs_is_an_error() -> None:
    text = (ALWAYS % ("disagg-profile-handler", "{}")) + """\
- name: extra
  plugins: [{pluginRef: queue-scorer}]
"""
    with pytest.raises(ConfigError, match="extra would never run"):
        runtime(text)


def test_decider_without_prefill_profile_is_an_error() -> None:
    text = ALWAYS.split("schedulingProfiles:")[0] + """\
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]
"""
    with pytest.raises(ConfigError, match="the prefill profile"):
        runtime(text % ("disagg-profile-handler",
                        "{deciders: {prefill: always-disagg-pd-decider}}"))


def test_prefill_header_handler_sets_the_header_from_the_named_profile() -> None:
    h = PluginHarness.of("prefill-header-handler", {"prefillProfile": "p"})
    from epp.scheduling.result import ProfileResult
    pre = role(3, "prefill")
    result = SchedulingResult({"d": ProfileResult("d", [role(1, "decode")]),
                               "p": ProfileResult("p", [pre])}, "d")
    h.plugin.pre_request(request("x"), result)  # type: ignore[attr-defined]
    assert result.extra_headers == {PREFILLER_HEADER: "10.0.0.3:8000"}


def test_prefill_pick_is_learnt_by_the_prefix_index() -> None:
    rt = runtime(LLMD_PD % 16)
    first = route(rt, request("q" * 4000), pool())
    assert first.prefiller == "10.0.0.3:8000"
    # the same prompt again: the prefix scorer (weight 2) now prefers the prefill pod that
    # computed it, although its queue is not the shortest any more
    busy = [role(1, "decode"), role(2, "decode"), role(3, "prefill", waiting=5),
            role(4, "prefill")]
    again = route(rt, request("q" * 4000 + "r" * 200), busy)
    assert again.prefiller == "10.0.0.3:8000"


def test_unknown_decider_parameter_is_an_error() -> None:
    with pytest.raises(PluginError, match="unknown parameters"):
        PluginHarness.of("prefix-based-pd-decider", {"threshold": 3})


# -- in-flight load of the prefill pick (inflight-load-producer) ---------------------------

def _respond(rt: Runtime, req: LLMRequest, routed: Routed, *, headers: bool = True) -> None:
    """What the director does on the way back: response headers (when they came), then the
    end of the exchange, each plugin called with the primary endpoint."""
    decode = routed.result.endpoints[0]
    response = Response(req.request_id, status=200, completed=headers)
    if headers:
        for plugin in rt.response_received:
            plugin.response_received(req, response, decode)
    for plugin in rt.response_complete:
        plugin.response_complete(req, response, decode)


def test_prefill_pick_counts_in_flight_until_the_response_headers() -> None:
    rt = runtime(LLMD_PD % 16)
    pods = pool()
    req = request("x" * 4000)  # 1,000 tokens
    r = route(rt, req, pods)
    decode, prefill = pods[0], pods[2]
    assert (r.decode, r.prefiller) == (decode.key, prefill.key)
    assert (decode.inflight_requests, decode.inflight_tokens) == (1, 1000)
    assert (prefill.inflight_requests, prefill.inflight_tokens) == (1, 1000)
    assert prefill.queue == 1  # a pick the next scrape has not seen yet
    for plugin in rt.response_received:  # the sidecar's prefill leg is over
        plugin.response_received(req, Response(req.request_id, status=200), decode)
    assert (prefill.inflight_requests, prefill.inflight_tokens) == (0, 0)
    assert decode.inflight_requests == 1
    for plugin in rt.response_complete:
        plugin.response_complete(req, Response(req.request_id, status=200, completed=True),
                                 decode)
    assert [v.inflight_requests for v in pods] == [0, 0, 0, 0]
    assert [v.inflight_tokens for v in pods] == [0, 0, 0, 0]


def test_the_prompt_is_pending_on_the_prefill_pick_until_the_response_headers() -> None:
    rt = runtime(LLMD_PD % 16)
    pods = pool()
    req = request("x" * 4000)  # 1,000 tokens, nothing cached yet
    r = route(rt, req, pods)
    decode, prefill = pods[0], pods[2]
    assert (r.decode, r.prefiller) == (decode.key, prefill.key)
    assert (decode.prefill_tokens, prefill.prefill_tokens) == (0, 1000)
    for plugin in rt.response_received:  # the sidecar's prefill leg is over
        plugin.response_received(req, Response(req.request_id, status=200), decode)
    assert [v.prefill_tokens for v in pods] == [0, 0, 0, 0]


def test_exchange_without_response_headers_releases_the_prefill_pick_at_its_end() -> None:
    rt = runtime(LLMD_PD % 16)
    pods = pool()
    req = request("x" * 4000)
    r = route(rt, req, pods)
    assert r.prefiller == pods[2].key and pods[2].inflight_requests == 1
    _respond(rt, req, r, headers=False)  # e.g. the decode pod reset the connection
    assert [v.inflight_requests for v in pods] == [0, 0, 0, 0]


def test_decode_only_request_counts_on_the_decode_pod_only() -> None:
    rt = runtime(LLMD_PD % 256)
    pods = pool()
    req = request("x" * 40)  # 10 tokens: decoded locally
    r = route(rt, req, pods)
    assert r.prefiller is None
    assert [v.inflight_requests for v in pods] == [1, 0, 0, 0]
    _respond(rt, req, r)
    assert [v.inflight_requests for v in pods] == [0, 0, 0, 0]


# The prefill profile with a load-aware scorer: llm-d's active-request-scorer reads the
# in-flight counts the producer keeps.
ACTIVE_PREFILL = LLMD_PD.split("schedulingProfiles:")[0] + """\
- type: active-request-scorer
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: active-request-scorer, weight: 2}
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker},
            {pluginRef: queue-scorer, weight: 1}]
"""


def test_successive_prefill_picks_spread_over_the_prefill_pods() -> None:
    rt = runtime(ACTIVE_PREFILL % 16)
    pods = [role(1, "decode"), role(2, "decode"), role(3, "prefill"),
            role(4, "prefill", waiting=1)]
    first = route(rt, request("a" * 4000), pods)
    assert first.prefiller == pods[2].key  # the shorter queue
    # pod 3 now computes a prompt: equal queues (its pick is not scraped yet), one request
    # in flight there and none on pod 4
    second = route(rt, request("b" * 4000), pods)
    assert second.prefiller == pods[3].key
    assert (pods[2].inflight_requests, pods[3].inflight_requests) == (1, 1)


def test_prefill_pick_is_published_to_the_shared_state_store() -> None:
    from epp.requestcontrol.plugins import InflightLoadProducer
    from epp.statestore import MemoryStateStore

    shared = MemoryStateStore()
    rt = build(parse_config(LLMD_PD % 16), state_store=shared)
    (producer,) = rt.handle.find(InflightLoadProducer)
    assert producer.store is shared
    pods = pool()
    req = request("x" * 4000)
    r = route(rt, req, pods)
    assert (shared.inflight(pods[2].key).requests, shared.inflight(pods[2].key).tokens) == \
        (1, 1000)
    _respond(rt, req, r)
    assert shared.inflight(pods[2].key).requests == 0
    assert shared.inflight(pods[0].key).requests == 0


# -- load-aware-pd-decider (ours): spill long prompts onto nearly idle decode pods ----------

LOAD_AWARE = LLMD_PD.replace(
    "- type: prefix-based-pd-decider\n  parameters: {nonCachedTokens: %d}",
    "- type: load-aware-pd-decider\n  parameters: %s").replace(
    "deciders: {prefill: prefix-based-pd-decider}", "deciders: {prefill: load-aware-pd-decider}")
SPILL = "{nonCachedTokens: 256, prefillBacklogTokens: 2000, maxDecodeRequests: 1}"


def role_store() -> Datastore:
    """The EPP's datastore holding :func:`pool`'s four pods with their roles and queues (the
    decider reads the prefill pods' in-flight counts from it, as in the EPP)."""
    ips = [f"10.0.0.{i}" for i in (1, 2, 3, 4)]
    objects = [parse_object(d) for d in pool_manifests("pool", [(f"pod-{i}", ip) for i, ip in
                                                               enumerate(ips)], 8000)]
    for obj, value in zip([o for o in objects if o is not None][1:],
                          ("decode", "decode", "prefill", "prefill"), strict=True):
        obj.labels[ROLE_LABEL] = value  # type: ignore[union-attr]
    ds = Datastore()
    ds.replace(build_snapshot([o for o in objects if o is not None], pool_name="pool",
                              pool_namespace="default"))
    for view, waiting in zip(ds.views(), (0, 3, 0, 2), strict=True):
        view.begin_scrape()
        ds.record_scrape(view, EndpointMetrics(waiting=waiting, running=0, kv_usage=0.0,
                                               updated_at=time.monotonic() + 3600))
    return ds


def spill_runtime(params: str = SPILL) -> tuple[Runtime, list[EndpointView]]:
    ds = role_store()
    return build(parse_config(LOAD_AWARE % params), ds), list(ds.candidates())


def test_load_aware_decider_disaggregates_while_a_prefill_pod_has_room() -> None:
    rt, pods = spill_runtime()
    decode, prefill = pods[0], pods[2]
    pods[3].start_request(5000)  # one prefill pod busy, the other idle
    r = route(rt, request("x" * 8000), pods)  # 2,000 tokens
    assert (r.decode, r.prefiller) == (decode.key, prefill.key)
    assert (prefill.inflight_tokens, pods[3].inflight_tokens) == (2000, 5000)


def test_load_aware_decider_prefills_on_an_idle_decode_pod_when_prefill_is_backlogged() -> None:
    rt, pods = spill_runtime()
    pods[2].start_request(2000)
    pods[3].start_request(3000)  # both prefill pods at or over prefillBacklogTokens
    r = route(rt, request("x" * 8000), pods)
    assert r.decode == pods[0].key
    assert r.prefiller is None
    assert set(r.result.results) == {"decode"}
    assert (pods[2].inflight_tokens, pods[3].inflight_tokens) == (2000, 3000)


def test_load_aware_decider_keeps_disaggregating_for_a_busy_decode_pod() -> None:
    rt, pods = spill_runtime()
    pods[2].start_request(2000)
    pods[3].start_request(3000)
    for view in pods[:2]:  # both decode pods already decode two requests (> maxDecodeRequests)
        view.start_request(100)
        view.start_request(100)
    r = route(rt, request("x" * 8000), pods)
    assert r.prefiller == pods[2].key  # the shorter queue (llm-d's sample scorers)


def test_load_aware_decider_keeps_short_prompts_local_as_prefix_based() -> None:
    rt, pods = spill_runtime()
    assert route(rt, request("x" * 1000), pods).prefiller is None  # 250 tokens < 256


def test_load_aware_decider_counts_the_spilled_prompt_on_the_decode_pod() -> None:
    rt, pods = spill_runtime()
    pods[2].start_request(2000)
    pods[3].start_request(2000)
    # pod 1 keeps the shorter queue (0, 1, 2 against pod 2's 3) for three picks
    first = route(rt, request("a" * 8000), pods)  # 0 requests there: spilled
    assert (first.decode, first.prefiller) == (pods[0].key, None)
    second = route(rt, request("b" * 8000), pods)  # the first counts: 1 ≤ 1, spilled
    assert (second.decode, second.prefiller) == (pods[0].key, None)
    third = route(rt, request("c" * 8000), pods)  # 2 > 1: disaggregated after all
    assert (third.decode, third.prefiller) == (pods[0].key, pods[2].key)


@pytest.mark.parametrize(("params", "error"), [
    ("{prefillBacklogTokens: 2000, maxDecodeRequests: 1}", "nonCachedTokens must be at least 1"),
    ("{nonCachedTokens: 256, maxDecodeRequests: 1}", "prefillBacklogTokens must be at least 1"),
    ("{nonCachedTokens: 256, prefillBacklogTokens: 2000}", "maxDecodeRequests is required"),
    ("{nonCachedTokens: 256, prefillBacklogTokens: 2000, maxDecodeRequests: -1}",
     "maxDecodeRequests is required"),
])
def test_load_aware_decider_bad_parameters_are_config_errors(params: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        spill_runtime(params)


def test_load_aware_decider_unknown_parameter_is_an_error() -> None:
    with pytest.raises(PluginError, match="unknown parameters"):
        PluginHarness.of("load-aware-pd-decider", {"nonCachedTokens": 1,
                                                   "prefillBacklogTokens": 1,
                                                   "maxDecodeRequests": 0, "spill": 3})


def test_prompt_tokens_gate_keeps_short_prompts_local_whatever_the_cache() -> None:
    gated = LLMD_PD.replace("parameters: {nonCachedTokens: %d}",
                            "parameters: {nonCachedTokens: %d, promptTokens: 2000}")
    rt = runtime(gated % 256)
    short = route(rt, request("x" * 4000), pool())  # 1,000 uncached tokens < promptTokens
    assert short.prefiller is None
    long = route(rt, request("y" * 12000), pool())  # 3,000 tokens
    assert long.prefiller == "10.0.0.3:8000"
