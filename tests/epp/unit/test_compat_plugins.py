"""Plugin types upstream v1.5 and llm-d register, built here (issue #13): each one's
behaviour, its parameter checks, and the "issue #N" answer for types other issues own."""

from __future__ import annotations

import random
import time

import pytest

from epp.config import ConfigError, build, builtin_registry, parse_config
from epp.config.builtins import PENDING
from epp.requestcontrol import Director
from epp.requestcontrol.plugin import Response
from epp.requestcontrol.plugins import (
    DestinationEndpointServedVerifier,
    PassthroughParser,
    ProbabilisticAdmitter,
)
from epp.requestcontrol.plugins.probabilistic_admitter import ProbabilisticParameters
from epp.scheduling import LLMRequest
from epp.scheduling.plugins import (
    ActiveRequestScorer,
    ByLabelFilter,
    ContextLengthAware,
    HeaderBasedTestingFilter,
    NoHitLRUScorer,
)
from epp.scheduling.plugins.filter.by_label_filter import ByLabelParameters
from epp.scheduling.plugins.profile.data_parallel_profile_handler import DATA_PARALLEL_HEADER
from epp.scheduling.plugins.scorer.active_request_scorer import ActiveRequestParameters
from epp.scheduling.plugins.scorer.context_length_aware import (
    ContextLengthParameters,
    range_score,
)
from shared.errors import GatewayError
from shared.plugins import PluginError
from tests.epp.unit.test_director import HEADERS, body, store


def req(headers: dict[str, str] | None = None, *, priority: int = 0, tokens: int = 0,
        ) -> LLMRequest:
    return LLMRequest(request_id="r", target_model="m", headers=headers or {},
                      priority=priority, prompt_tokens=tokens)


# -- header-based-testing-filter --------------------------------------------------------------


def test_testing_filter_keeps_the_endpoints_the_header_names_in_its_order(make_view) -> None:
    views = [make_view(i) for i in range(4)]
    f = HeaderBasedTestingFilter()
    kept = f.filter(req({"test-epp-endpoint-selection": "10.0.0.3:8000, 10.0.0.1"}), views)
    assert [v.key for v in kept] == ["10.0.0.3:8000", "10.0.0.1:8000"]


def test_testing_filter_without_header_or_match_keeps_nothing(make_view) -> None:
    views = [make_view(i) for i in range(2)]
    f = HeaderBasedTestingFilter()
    assert list(f.filter(req(), views)) == []
    assert list(f.filter(req({"test-epp-endpoint-selection": "10.0.0.1:9999"}), views)) == []


# -- by-label, by-label-selector ---------------------------------------------------------------


def test_by_label_keeps_valid_values_and_optionally_unlabelled(make_view) -> None:
    views = [make_view(1, labels={"gpu": "a100"}), make_view(2, labels={"gpu": "h100"}),
             make_view(3, labels={})]
    strict = ByLabelFilter("f", ByLabelParameters(label="gpu", valid_values=["a100"]))
    assert [v.key for v in strict.filter(req(), views)] == ["10.0.0.1:8000"]
    loose = ByLabelFilter("f", ByLabelParameters(label="gpu", valid_values=["a100"],
                                                 allows_no_label=True))
    assert [v.key for v in loose.filter(req(), views)] == ["10.0.0.1:8000", "10.0.0.3:8000"]


def test_by_label_needs_values_unless_unlabelled_pods_are_allowed() -> None:
    with pytest.raises(PluginError, match="validValues"):
        builtin_registry().create("by-label", "f", {"label": "gpu"})


def test_by_label_selector_is_the_label_selector_filter(make_view) -> None:
    f = builtin_registry().create("by-label-selector", "f", {"matchLabels": {"gpu": "a100"}})
    views = [make_view(1, labels={"gpu": "a100"}), make_view(2, labels={"gpu": "h100"})]
    assert [v.key for v in f.filter(req(), views)] == ["10.0.0.1:8000"]  # type: ignore[attr-defined]


# -- active-request-scorer ---------------------------------------------------------------------


def test_active_request_scorer_idle_is_one_busy_scaled_to_the_busiest(make_view) -> None:
    a, b, c = make_view(1), make_view(2), make_view(3)
    for _ in range(4):
        b.start_request()
    for _ in range(2):
        c.start_request()
    s = ActiveRequestScorer("s", ActiveRequestParameters(idle_threshold=0, max_busy_score=0.5))
    assert list(s.score(req(), [a, b, c])) == [1.0, 0.0, 0.25]


def test_active_request_scorer_accepts_the_old_request_timeout() -> None:
    s = builtin_registry().create("active-request-scorer", "s", {"requestTimeout": "2m"})
    assert s.params.request_timeout == 120  # type: ignore[attr-defined]


# -- context-length-aware ----------------------------------------------------------------------


def test_context_length_scores_in_range_above_out_of_range(make_view) -> None:
    views = [make_view(1, labels={"llm-d.ai/context-length-range": "0-2048"}),
             make_view(2, labels={"llm-d.ai/context-length-range": "2049-8192"}),
             make_view(3, labels={}), make_view(4, labels={"llm-d.ai/context-length-range": "x"})]
    s = ContextLengthAware()
    scores = list(s.score(req(tokens=1000), views))
    assert scores[0] > 0.3 > scores[1] > 0.0
    assert scores[2:] == [0.5, 0.0]
    assert scores[0] == pytest.approx(range_score(1000, 0, 2048))
    assert range_score(5, 5, 5) == 1.0


def test_context_length_filters_only_when_enabled(make_view) -> None:
    views = [make_view(1, labels={"llm-d.ai/context-length-range": "0-100"}),
             make_view(2, labels={})]
    assert len(ContextLengthAware().filter(req(tokens=500), views)) == 2
    f = ContextLengthAware("c", ContextLengthParameters(enable_filtering=True))
    assert [v.key for v in f.filter(req(tokens=500), views)] == ["10.0.0.2:8000"]


# -- no-hit-lru-scorer -------------------------------------------------------------------------


LRU_CONFIG = """
plugins:
- type: prefix-cache-scorer
- type: no-hit-lru-scorer
  parameters: {lruSize: 8}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: no-hit-lru-scorer
"""


def test_no_hit_lru_sends_cold_requests_round_the_pool() -> None:
    runtime = build(parse_config(LRU_CONFIG), store(), rng=random.Random(0))
    d = Director.of(runtime)
    served = []
    for i in range(len(runtime.datastore.views())):
        _, routed = d.route(HEADERS, body(f"cold prompt number {i} " * 30), {})
        served.append(routed.endpoint.key)
        d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
                 completion_tokens=1)
    assert len(set(served)) == len(served)  # every cold request went somewhere new


def test_no_hit_lru_is_neutral_for_warm_requests(make_view) -> None:
    runtime = build(parse_config(LRU_CONFIG), store(), rng=random.Random(0))
    d = Director.of(runtime)
    prompt = "shared prefix " * 40
    _, first = d.route(HEADERS, body(prompt), {})
    pending = d.prepare(HEADERS, body(prompt), {})
    lru = runtime.handle.plugin("no-hit-lru-scorer", NoHitLRUScorer)
    assert not lru.is_cold(pending.request)
    assert set(lru.score(pending.request, pending.candidates)) == {0.5}
    d.finish(first, completed=True, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=1)


LRU_PRODUCER_CONFIG = """
plugins:
- type: approx-prefix-cache-producer
  name: prefixes
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: prefixes}
- type: no-hit-lru-scorer
  parameters: {lruSize: 8, prefixMatchInfoProducerName: prefixes}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: no-hit-lru-scorer
"""


def test_no_hit_lru_reads_the_producer_named_by_prefix_match_info_producer_name() -> None:
    runtime = build(parse_config(LRU_PRODUCER_CONFIG), store(), rng=random.Random(0))
    d = Director.of(runtime)
    prompt = "shared prefix " * 40
    lru = runtime.handle.plugin("no-hit-lru-scorer", NoHitLRUScorer)
    cold = d.prepare(HEADERS, body(prompt), {})
    assert lru.is_cold(cold.request, cold.candidates)
    _, first = d.route(HEADERS, body(prompt), {})
    warm = d.prepare(HEADERS, body(prompt), {})
    assert not lru.is_cold(warm.request, warm.candidates)
    d.finish(first, completed=True, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=1)


def test_no_hit_lru_refuses_a_producer_name_that_is_no_prefix_producer() -> None:
    cfg = LRU_PRODUCER_CONFIG.replace("lruSize: 8, prefixMatchInfoProducerName: prefixes",
                                      "lruSize: 8, prefixMatchInfoProducerName: "
                                      "prefix-cache-scorer")
    with pytest.raises((ConfigError, PluginError), match="not a prefix-cache producer"):
        build(parse_config(cfg), store(), rng=random.Random(0))


def test_no_hit_lru_ranks_least_recently_served_first(make_view) -> None:
    s = NoHitLRUScorer()
    views = [make_view(i) for i in range(3)]
    s.lru.update({views[2].key: None, views[0].key: None})  # 2 oldest, 0 newest
    # never-served 1 ranks first, then 2, then 0
    assert list(s.score(req(), views)) == [0.0, 1.0, 0.5]


def test_no_hit_lru_refuses_a_prefix_plugin_of_another_type() -> None:
    text = LRU_CONFIG.replace("parameters: {lruSize: 8}",
                              "parameters: {prefixPluginType: precise-prefix-cache-scorer}")
    with pytest.raises(ConfigError, match="is a prefix-cache-scorer, not a precise"):
        build(parse_config(text), store())


# -- data-parallel-profile-handler -------------------------------------------------------------


def test_data_parallel_sends_to_the_primary_port_and_names_the_rank() -> None:
    text = ("plugins:\n- type: data-parallel-profile-handler\n  parameters: {primaryPort: 9000}"
            "\n- type: queue-scorer\n")
    d = Director.of(build(parse_config(text), store(), rng=random.Random(0)))
    decision, routed = d.route(HEADERS, body(), {})
    ip = routed.endpoint.endpoint.address
    assert decision.set_headers[DATA_PARALLEL_HEADER] == routed.endpoint.key
    assert decision.set_headers["x-gateway-destination-endpoint"] == f"{ip}:9000"
    assert decision.metadata == {"envoy.lb": {"x-gateway-destination-endpoint": f"{ip}:9000"}}


def test_data_parallel_port_is_checked() -> None:
    with pytest.raises(PluginError, match="primaryPort"):
        builtin_registry().create("data-parallel-profile-handler", "h", {"primaryPort": 0})


# -- probabilistic-admitter --------------------------------------------------------------------


def test_probabilistic_admitter_admits_non_sheddable_always(make_view) -> None:
    a = ProbabilisticAdmitter(rng=random.Random(0))
    views = [make_view(1, waiting=100, kv=1.0)]
    for _ in range(50):
        a.admit(req(priority=0), views)


def test_probabilistic_admitter_sheds_by_the_curve(make_view) -> None:
    a = ProbabilisticAdmitter("a", ProbabilisticParameters(), rng=random.Random(1))
    calm = [make_view(1, waiting=0, kv=0.08)]  # saturation 0.1 -> p = 0.003
    busy = [make_view(1, waiting=5, kv=0.0)]  # saturation 1 -> p = 1
    assert a.probability(a.saturation(calm)) == pytest.approx(0.1**5 * 300)
    rejected = 0
    for _ in range(200):
        try:
            a.admit(req(priority=-1), calm)
        except GatewayError:
            rejected += 1
    assert rejected < 10
    with pytest.raises(GatewayError) as e:
        a.admit(req(priority=-1), busy)
    assert e.value.status == 429


def test_probabilistic_admitter_counts_stale_endpoints_as_saturated(make_view) -> None:
    a = ProbabilisticAdmitter(staleness=2.0)
    stale = [make_view(1, updated_at=time.monotonic() - 60)]
    assert a.saturation(stale) == 1.0


def test_probabilistic_admitter_parameters_must_be_positive() -> None:
    with pytest.raises(PluginError, match="power"):
        builtin_registry().create("probabilistic-admitter", "a", {"power": 0})


def test_probabilistic_admitter_rejects_through_the_director() -> None:
    text = "plugins:\n- type: probabilistic-admitter\n  parameters: {k: 1000000000}\n"
    runtime = build(parse_config(text), store())
    for v in runtime.datastore.views():
        v.begin_scrape()
        runtime.datastore.record_scrape(v, v.metrics.__class__(
            waiting=5, running=0, kv_usage=0.9, updated_at=time.monotonic() + 3600))
    # sheddable requests need an objective with negative priority; a plain one passes
    d = Director.of(runtime)
    pending = d.prepare(HEADERS, body(), {})
    pending.request.priority = -1
    with pytest.raises(GatewayError, match="probabilistic-admitter"):
        for admitter in runtime.admitters:
            admitter.admit(pending.request, pending.candidates)


# -- passthrough-parser ------------------------------------------------------------------------


def test_passthrough_parser_routes_any_body_unchanged() -> None:
    text = "plugins:\n- type: passthrough-parser\n- type: queue-scorer\nparser:\n" \
           "  pluginRef: passthrough-parser\n"
    d = Director.of(build(parse_config(text), store(), rng=random.Random(0)))
    raw = b"\x00\x01 not json at all"
    decision, routed = d.route(HEADERS, raw, {})
    assert decision.body is None  # the body goes on as sent
    assert routed.endpoint is not None
    assert isinstance(d.runtime.parser, PassthroughParser)


def test_passthrough_parser_body_is_never_rewritten() -> None:
    from dataclasses import replace

    text = "plugins:\n- type: passthrough-parser\nparser:\n  pluginRef: passthrough-parser\n"
    ds = store()
    from epp.datastore.models import WeightedModel

    ds.replace(replace(ds.snapshot, _match_all=(WeightedModel("other"),),
                       _match_all_name="rw"))
    d = Director.of(build(parse_config(text), ds, rng=random.Random(0)))
    decision, _ = d.route(HEADERS, b'{"model": "m", "prompt": "x"}', {})
    assert decision.body is None


# -- destination-endpoint-served-verifier ------------------------------------------------------


@pytest.mark.parametrize(("metadata", "header"), [
    ({"envoy.lb": {"x-gateway-destination-endpoint-served": "10.0.0.1:8000"}}, "10.0.0.1:8000"),
    ({}, "fail: missing envoy lb metadata"),
    ({"envoy.lb": {}}, "fail: missing destination endpoint served metadata"),
])
def test_served_verifier_reports_what_the_proxy_served(metadata: dict[str, object],
                                                       header: str) -> None:
    text = "plugins:\n- type: destination-endpoint-served-verifier\n- type: queue-scorer\n"
    d = Director.of(build(parse_config(text), store(), rng=random.Random(0)))
    _, routed = d.route(HEADERS, body(), {})
    added = d.response_received(routed, 200, {}, metadata)
    assert added == {"x-conformance-test-served-endpoint": header}
    assert isinstance(d.runtime.response_received[0], DestinationEndpointServedVerifier)


def test_served_verifier_alone_on_a_response() -> None:
    r = Response("r", metadata={"envoy.lb": {"x-gateway-destination-endpoint-served": "a:1"}})
    DestinationEndpointServedVerifier().response_received(req(), r, None)  # type: ignore[arg-type]
    assert r.set_headers == {"x-conformance-test-served-endpoint": "a:1"}


# -- types owned by other issues ---------------------------------------------------------------


@pytest.mark.parametrize(("type_name", "issue"), [
    ("eviction-sheddable-filter", "sheddable-eviction-filter"), ("tokenizer", "#15"),
    ("disagg-headers-handler", "#29"),
    ("predicted-latency-scorer", "#17"),
])
def test_types_of_other_issues_are_unknown_naming_the_issue(type_name: str, issue: str) -> None:
    with pytest.raises(ConfigError) as e:
        build(parse_config(f"plugins:\n- type: {type_name}\n", source="c.yaml"))
    assert f"unknown plugin type {type_name!r}" in str(e.value)
    assert issue in str(e.value) and "c.yaml: plugins[0]" in str(e.value)


def test_no_pending_type_is_also_registered() -> None:
    assert set(PENDING) & set(builtin_registry().types) == set()


def test_served_verifier_through_the_ext_proc_stream() -> None:
    """Envoy forwards ``envoy.lb`` with the response headers; the verifier's header goes
    back as a response header mutation."""
    from google.protobuf import struct_pb2

    from epp.handlers.exchange import PickerExchange
    from shared.extproc import BodyMode, ExtProcServicer
    from tests.support.inprocess import body_msgs, headers_msg, run_stream

    text = "plugins:\n- type: destination-endpoint-served-verifier\n- type: queue-scorer\n"
    d = Director.of(build(parse_config(text), store(), rng=random.Random(0)))
    servicer = ExtProcServicer(lambda: PickerExchange(d), request_mode=BodyMode.BUFFERED,
                               response_mode=BodyMode.BUFFERED)
    served = struct_pb2.Struct()
    served.update({"x-gateway-destination-endpoint-served": "10.9.9.9:8000"})
    response_headers = headers_msg([(":status", "200"), ("content-type", "text/plain")],
                                   response=True, end_of_stream=True)
    response_headers.metadata_context.filter_metadata["envoy.lb"].CopyFrom(served)
    msgs = [headers_msg([(":path", "/v1/completions"), ("content-type", "application/json")]),
            *body_msgs(body(), []), response_headers]
    out = run_stream(servicer, msgs)
    (resp,) = [r for r in out if r.HasField("response_headers")]
    mutation = resp.response_headers.response.header_mutation.set_headers
    assert {h.header.key: h.header.raw_value.decode() for h in mutation} == {
        "x-conformance-test-served-endpoint": "10.9.9.9:8000"}


# -- models-data-source / models-data-extractor ------------------------------------------------


def test_models_listing_becomes_what_the_pool_serves() -> None:
    """A real simulated vLLM with a LoRA adapter: its /v1/models listing lands on the
    endpoint, and the director then knows the adapter (a LoRA request) and the base model."""
    import asyncio

    import aiohttp

    from devkit.manifests import pool_manifests
    from epp.datalayer import ModelsDataSource, ServedModels
    from epp.datastore import Datastore, EndpointMetrics, build_snapshot, parse_object
    from sim import ServerConfig, start_fleet
    from sim.profiles import TINY

    text = """
plugins:
- type: metrics-data-source
- type: core-metrics-extractor
- type: models-data-source
  parameters: {refreshInterval: 1s}
- type: models-data-extractor
- type: queue-scorer
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: core-metrics-extractor}]
  - pluginRef: models-data-source
    extractors: [{pluginRef: models-data-extractor}]
"""

    async def go() -> None:
        cfg = ServerConfig(profile=TINY, model="base", lora_modules={"sql-lora": "/p"})
        async with start_fleet([cfg]) as fleet:
            port = fleet.ports[0]
            ds = Datastore()
            objs = [parse_object(d) for d in pool_manifests("pool", [("p0", "127.0.0.1")], port)]
            ds.replace(build_snapshot([o for o in objs if o is not None], pool_name="pool",
                                      pool_namespace="default"))
            for view in ds.views():
                view.begin_scrape()
                ds.record_scrape(view, EndpointMetrics(updated_at=time.monotonic() + 3600))
            runtime = build(parse_config(text), ds, rng=random.Random(0))
            source = next(s for s in runtime.data_sources if isinstance(s, ModelsDataSource))
            async with aiohttp.ClientSession() as session:
                await source.poll_once(ds, session)
            (view,) = ds.views()
            listed = view.attribute(ServedModels)
            assert listed is not None
            assert (listed.base_models, listed.adapters) == ({"base"}, {"sql-lora"})
            d = Director.of(runtime)
            _, routed = d.route(HEADERS, b'{"model": "sql-lora", "prompt": "x"}', {})
            assert routed.request.lora_adapter == "sql-lora"
            _, routed = d.route(HEADERS, b'{"model": "base", "prompt": "x"}', {})
            assert routed.request.lora_adapter is None

    asyncio.run(go())


def test_models_listing_parse_errors_are_refused() -> None:
    from epp.datalayer.models_source import ModelEntry, parse_listing

    assert parse_listing(b'{"data": [{"id": "a"}, {"id": "b", "parent": "a"}, {"x": 1}]}') == (
        ModelEntry("a"), ModelEntry("b", "a"))
    for bad in (b"nope", b'{"data": 3}', b"[]"):
        with pytest.raises(ValueError):
            parse_listing(bad)


def test_models_extractor_only_reads_the_models_source() -> None:
    text = """
plugins:
- type: metrics-data-source
- type: models-data-extractor
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: models-data-extractor}]
"""
    with pytest.raises(ConfigError, match="reads openai-models"):
        build(parse_config(text))


# -- request-attribute-reporter ----------------------------------------------------------------


REPORTER = """
plugins:
- type: queue-scorer
- type: request-attribute-reporter
  parameters:
    attributes:
    - key: {name: x-gateway-inference-request-cost}
      expression: usage.prompt_tokens + usage.completion_tokens
      condition: has(usage.prompt_tokens) && has(usage.completion_tokens)
"""


def reporter_director() -> Director:
    return Director.of(build(parse_config(REPORTER), store(), rng=random.Random(0)))


def test_reporter_computes_the_cost_into_envoy_lb_metadata() -> None:
    d = reporter_director()
    _, routed = d.route(HEADERS, body(), {})
    assert d.response_metadata(routed, {"prompt_tokens": 10, "completion_tokens": 5}) == {
        "envoy.lb": {"x-gateway-inference-request-cost": 15}}
    # the condition is false: nothing is reported
    assert d.response_metadata(routed, {"prompt_tokens": 10}) is None
    assert d.response_metadata(routed, None) is None


def test_reporter_truncates_numbers_and_skips_zero_and_non_numbers() -> None:
    reg = builtin_registry()

    def reporter(expression: str) -> object:
        return reg.create("request-attribute-reporter", "r", {"attributes": [
            {"key": {"name": "k", "namespace": "my.ns"}, "expression": expression}]})

    assert reporter("usage.total_tokens * 1.5").value({"total_tokens": 3}) == 4  # type: ignore[attr-defined]
    assert reporter("usage.total_tokens - 3.0").value({"total_tokens": 3}) is None  # type: ignore[attr-defined]
    assert reporter("'text'").value({}) is None  # type: ignore[attr-defined]
    assert reporter("usage.missing + 1").value({}) is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("attributes", "message"), [
    ([], "exactly one entry"),
    ([{"key": {"name": "a"}, "expression": "1"}, {"key": {"name": "b"}, "expression": "2"}],
     "exactly one entry"),
    ([{"key": {}, "expression": "1"}], "key.name"),
    ([{"key": {"name": "a"}}], "expression must not be empty"),
    ([{"key": {"name": "a"}, "expression": "usage.x +"}], "not valid CEL"),
    ([{"key": {"name": "a"}, "expression": "1", "condition": "&&"}], "condition: not valid CEL"),
])
def test_reporter_refuses_bad_parameters(attributes: list[object], message: str) -> None:
    with pytest.raises(PluginError, match=message):
        builtin_registry().create("request-attribute-reporter", "r", {"attributes": attributes})


def test_reporter_metadata_reaches_envoy_with_the_last_body_answer() -> None:
    """Through the ext_proc stream (FULL_DUPLEX both ways, as the EPP runs): the answer to
    the response's last body message carries the dynamic metadata."""
    from epp.handlers.exchange import PickerExchange
    from shared.extproc import BodyMode, ExtProcServicer
    from tests.support.inprocess import body_msgs, headers_msg, run_stream

    d = reporter_director()
    servicer = ExtProcServicer(lambda: PickerExchange(d),
                               request_mode=BodyMode.FULL_DUPLEX_STREAMED,
                               response_mode=BodyMode.FULL_DUPLEX_STREAMED)
    answer = (b'{"id":"x","model":"m","choices":[],'
              b'"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}')
    msgs = [headers_msg([(":path", "/v1/completions"), ("content-type", "application/json")]),
            *body_msgs(body(), [10]),
            headers_msg([(":status", "200"), ("content-type", "application/json")],
                        response=True),
            *body_msgs(answer, [20], response=True)]
    out = run_stream(servicer, msgs)
    with_metadata = [r for r in out if r.HasField("dynamic_metadata")
                     and "envoy.lb" in r.dynamic_metadata.fields
                     and r.HasField("response_body")]
    (last,) = with_metadata
    assert last is [r for r in out if r.HasField("response_body")][-1]
    lb = last.dynamic_metadata.fields["envoy.lb"].struct_value
    assert lb.fields["x-gateway-inference-request-cost"].number_value == 9


# -- endpoint-notification-source ---------------------------------------------------------------


def test_endpoint_events_reach_a_third_party_extractor() -> None:
    """A plugin author's extractor (registered like an entry-point plugin) hears endpoints
    join, change and leave the pool."""
    from dataclasses import replace

    from epp.datalayer import EndpointEvent, EndpointExtractor, EndpointNotificationSource
    from epp.scheduling.plugin import Plugin as EppPlugin
    from shared.plugins import PluginRegistry

    heard: list[tuple[str, str]] = []

    class Recorder(EppPlugin, EndpointExtractor):
        type_name = "event-recorder"

        def on_endpoint_event(self, event: EndpointEvent) -> None:
            heard.append((event.kind.value, event.endpoint.key))

    from epp.config import BUILTIN_PLUGINS

    text = """
plugins:
- type: endpoint-notification-source
- type: event-recorder
- type: queue-scorer
dataLayer:
  sources:
  - pluginRef: endpoint-notification-source
    extractors: [{pluginRef: event-recorder}]
  injectDefaults: false
"""
    ds = store()
    runtime = build(parse_config(text), ds, registry=PluginRegistry((*BUILTIN_PLUGINS, Recorder)))
    (source,) = runtime.data_sources
    assert isinstance(source, EndpointNotificationSource)
    source.on_snapshot(ds, ds.snapshot)
    first = sorted(heard)
    assert first and all(kind == "added" for kind, _ in first)
    heard.clear()
    snap = ds.snapshot
    gone, changed, *rest = snap.endpoints
    relabelled = replace(changed, labels={**changed.labels, "tier": "gold"})
    ds.replace(replace(snap, endpoints=(relabelled, *rest)))
    source.on_snapshot(ds, ds.snapshot)
    assert sorted(heard) == sorted([("deleted", gone.key), ("updated", changed.key)])


def test_a_notification_source_without_extractors_is_refused() -> None:
    text = """
plugins:
- type: endpoint-notification-source
dataLayer:
  sources: [{pluginRef: endpoint-notification-source}]
"""
    with pytest.raises(ConfigError, match="does nothing without an extractor"):
        build(parse_config(text))
