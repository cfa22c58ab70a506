"""Plugins that existed before v0.10 with the parameters and defaults llm-d-router v0.10.0
gives them: ``prefix-cache-affinity-filter`` (``ttftSource``, ``peakPrefillThroughput``,
``maxTTFTPenaltyMs`` spelled as upstream, new defaults) and ``inflight-load-producer``
(``addEstimatedOutputTokens``, ``outputRatio``, ``maxEstimatedOutputTokens``)."""

from __future__ import annotations

from typing import Any

import pytest

from epp.config.builtins import builtin_registry
from epp.requestcontrol.plugin import Response
from epp.scheduling import LLMRequest
from epp.scheduling.result import ProfileResult, SchedulingResult
from shared.plugins import PluginError


def plugin(type_name: str, **params: Any) -> Any:
    return builtin_registry().create(type_name, "", params)


def prompt_req(rid: str = "r", **kw: Any) -> LLMRequest:
    return LLMRequest(request_id=rid, target_model="m", client_model="m", prompt=b"x" * 640,
                      **kw)


def test_affinity_filter_takes_v010_defaults_and_upstreams_spelling() -> None:
    p = plugin("prefix-cache-affinity-filter").params
    assert (p.exploration_probability, p.max_ttft_penalty_ms, p.ttft_source,
            p.peak_prefill_throughput) == (0.0, 18000.0, "prefillThroughput", 15928.0)
    assert plugin("prefix-cache-affinity-filter",
                  maxTTFTPenaltyMs=5000).params.max_ttft_penalty_ms == 5000
    with pytest.raises(PluginError, match="must be one of"):
        plugin("prefix-cache-affinity-filter", ttftSource="guess")
    with pytest.raises(PluginError, match="peakPrefillThroughput"):
        plugin("prefix-cache-affinity-filter", peakPrefillThroughput=0)


def test_affinity_filter_breaks_stickiness_on_in_flight_prefill_time(make_view) -> None:
    f = plugin("prefix-cache-affinity-filter", maxTTFTPenaltyMs=1000,
               peakPrefillThroughput=10000)
    sticky, other = make_view(1), make_view(2)
    f.producer.record(prompt_req(), sticky)
    sticky.start_request(5000)  # 5,000 tokens / 10,000 tok/s = 500 ms: within the penalty
    assert list(f.filter(prompt_req("r2"), [sticky, other])) == [sticky]
    sticky.start_request(10000)  # 15,000 tokens = 1,500 ms > 0 ms + 1,000 ms
    assert list(f.filter(prompt_req("r3"), [sticky, other])) == [sticky, other]


def primary(view: Any) -> SchedulingResult:
    return SchedulingResult({"d": ProfileResult("d", [view])}, "d")


def test_inflight_producer_adds_the_output_estimate_and_takes_it_back(make_view) -> None:
    producer = plugin("inflight-load-producer", addEstimatedOutputTokens=True)
    view = make_view(1)
    r = prompt_req(prompt_tokens=100)
    producer.pre_request(r, primary(view))
    assert view.inflight_tokens == 100 + 150  # outputRatio 1.5
    producer.response_complete(r, Response("r"), view)
    assert (view.inflight_tokens, view.inflight_requests) == (0, 0)


def test_inflight_output_estimate_is_capped_by_the_client_and_the_parameter(make_view) -> None:
    producer = plugin("inflight-load-producer", addEstimatedOutputTokens=True,
                      outputRatio=2.0, maxEstimatedOutputTokens=150)
    assert producer.estimated_output(prompt_req(prompt_tokens=100)) == 150
    assert producer.estimated_output(prompt_req(prompt_tokens=100, max_output_tokens=20)) == 20
    assert plugin("inflight-load-producer").estimated_output(prompt_req(prompt_tokens=100)) == 0
    with pytest.raises(PluginError, match="outputRatio"):
        plugin("inflight-load-producer", outputRatio=-1)


def test_the_director_reads_the_clients_output_cap() -> None:
    from epp.scheduling.request import max_output_tokens

    assert max_output_tokens({"max_tokens": 7}) == 7
    assert max_output_tokens({"max_completion_tokens": 9}) == 9
    assert max_output_tokens({"max_output_tokens": 3}) == 3
    assert max_output_tokens({"max_tokens": True}) is None
    assert max_output_tokens({}) is None


def test_upstream_spellings_of_latency_parameters_load() -> None:
    assert plugin("latency-scorer", compositeKVWeight=2).params.composite_kv_weight == 2.0
    p = plugin("predicted-latency-producer", predictInProduce=False, contextTTL="5m").params
    assert p.predict_in_prepare_data is False and p.context_ttl == 300.0
    for params, why in (({"endpointRoleLabel": "llm-d.ai/role"}, "endpointRoleLabel"),
                        ({"useEncoderCacheFeatures": True}, "multimodal")):
        with pytest.raises(PluginError, match=why):
            plugin("predicted-latency-producer", **params)
