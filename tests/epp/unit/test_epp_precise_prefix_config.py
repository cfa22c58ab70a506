"""``precise-prefix-cache-scorer`` and ``token-producer``: llm-d's configs load, parameters
map onto the index and the subscribers, unsupported values are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.config import ConfigError, build, load_config_file, parse_config
from epp.datalayer import EndpointNotificationSource
from epp.requestcontrol.plugins.token_producer import TokenProducer
from epp.scheduling.plugins.prefix.precise_prefix_cache_scorer import PrecisePrefixCacheScorer
from tests.epp.unit.test_director import store

DATA = Path(__file__).parents[1] / "data"


def scorer_config(parameters: str = "{}", extra: str = "") -> str:
    return f"""\
plugins:
- type: precise-prefix-cache-scorer
  parameters: {parameters}
{extra}schedulingProfiles:
- name: default
  plugins: [{{pluginRef: precise-prefix-cache-scorer}}]
"""


def test_llm_d_sample_config_loads_with_its_data_layer_wiring() -> None:
    rt = build(load_config_file(DATA / "llm-d-epp-precise-prefix-cache-config.yaml"), store())
    scorer = rt.handle.plugin("precise-prefix-cache-scorer", PrecisePrefixCacheScorer)
    assert scorer.index.config.block_size == 64
    source = rt.handle.plugin("endpoint-notification-source", EndpointNotificationSource)
    assert source in rt.data_sources and source.extractors == [scorer]
    producer = rt.handle.plugin("token-producer", TokenProducer)
    assert producer in rt.admitters
    assert producer.url == "http://localhost:8000"
    assert scorer in rt.pre_request  # the approximate fallback learns from every pick


def test_llm_d_all_parameters_example_maps_onto_index_and_sources() -> None:
    rt = build(load_config_file(DATA / "llm-d-precise-prefix-all-parameters.yaml"), store())
    scorer = rt.handle.plugin("precise-prefix-cache-scorer", PrecisePrefixCacheScorer)
    cfg = scorer.index.config
    assert (cfg.block_size, cfg.max_keys, cfg.max_endpoints_per_key) == (16, 100_000_000, 10)
    # No dataLayer wiring: the build adds an endpoint-notification-source for the scorer.
    notifying = [s for s in rt.data_sources if isinstance(s, EndpointNotificationSource)]
    assert len(notifying) == 1 and notifying[0].extractors == [scorer]
    view = rt.datastore.views()[0]
    src = scorer.source_for(view)
    assert src.address == f"tcp://{view.endpoint.address}:5556"
    assert src.endpoint == view.endpoint.key and src.topic_filter == "kv@"
    assert src.replay_address is None


def test_port_offsets_and_replay_socket() -> None:
    rt = build(parse_config(scorer_config(
        "{kvEventsConfig: {topicFilter: '', podDiscoveryConfig: "
        "{socketPortOffset: 100, replaySocketPortOffset: 200}}}")), store())
    scorer = rt.handle.plugin("precise-prefix-cache-scorer", PrecisePrefixCacheScorer)
    view = rt.datastore.views()[0]
    src = scorer.source_for(view)
    ep = view.endpoint
    assert src.address == f"tcp://{ep.address}:{ep.port + 100}"
    assert src.replay_address == f"tcp://{ep.address}:{ep.port + 200}"
    assert src.topic_filter == ""


@pytest.mark.parametrize("name", ["llm-d-sim-epp-kvcache-config.yaml",
                                  "llm-d-sim-epp-tokenizer-vllm-http-config.yaml"])
def test_llm_d_centralized_sample_configs_load_with_a_bound_socket(name: str) -> None:
    """llm-d's samples name only ``zmqEndpoint``: the EPP binds it, the servers connect."""
    rt = build(load_config_file(DATA / name), store())
    scorer = rt.handle.plugin("precise-prefix-cache-scorer", PrecisePrefixCacheScorer)
    assert scorer.collector is not None and scorer.collector.address == "tcp://0.0.0.0:5557"
    assert scorer.collector.topic_filter == "kv@"
    assert scorer.subscriptions is None  # no per-endpoint subscriber dials the servers
    assert scorer.collector.bound is None  # building binds nothing (the EPP opens it)
    assert scorer.log_interval == 0  # metricsLoggingInterval needs enableMetrics (llm-d)


def kv_modes(parameters: str) -> PrecisePrefixCacheScorer:
    rt = build(parse_config(scorer_config(parameters)), store())
    return rt.handle.plugin("precise-prefix-cache-scorer", PrecisePrefixCacheScorer)


def test_discover_pods_false_binds_llm_ds_default_endpoint() -> None:
    scorer = kv_modes("{kvEventsConfig: {discoverPods: false}}")
    assert scorer.collector is not None and scorer.collector.address == "tcp://*:5557"
    assert scorer.subscriptions is None


def test_discover_pods_and_zmq_endpoint_run_both_modes_as_llm_d_does() -> None:
    scorer = kv_modes("{kvEventsConfig: {discoverPods: true, zmqEndpoint: 'tcp://*:6001'}}")
    assert scorer.collector is not None and scorer.collector.address == "tcp://*:6001"
    assert scorer.subscriptions is not None


def test_without_either_endpoints_are_discovered() -> None:
    scorer = kv_modes("{}")
    assert scorer.subscriptions is not None and scorer.collector is None


@pytest.mark.parametrize(("value", "seconds"), [
    ("60000000000", 60.0),  # nanoseconds, as llm-d's samples write it
    ("'1m30s'", 90.0),      # a Go duration, as llm-d-kv-cache documents it
    ("0", 0.0),
])
def test_metrics_logging_interval_accepts_nanoseconds_and_durations(value: str,
                                                                    seconds: float) -> None:
    scorer = kv_modes(f"{{indexerConfig: {{kvBlockIndexConfig: "
                      f"{{enableMetrics: true, metricsLoggingInterval: {value}}}}}}}")
    assert scorer.log_interval == seconds


def test_a_zmq_endpoint_in_use_is_refused_naming_the_parameter() -> None:
    import zmq

    taken: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    taken.bind("tcp://127.0.0.1:*")
    try:
        address = taken.getsockopt_string(zmq.LAST_ENDPOINT)
        scorer = kv_modes(f"{{kvEventsConfig: {{zmqEndpoint: '{address}'}}}}")
        with pytest.raises(ValueError, match=r"kvEventsConfig\.zmqEndpoint: cannot bind"):
            scorer.open()
    finally:
        taken.close(linger=0)


@pytest.mark.parametrize(("parameters", "message"), [
    ("{kvEventsConfig: {zmqEndpoint: 'udp://0.0.0.0:5557'}}", "zmqEndpoint"),
    ("{kvEventsConfig: {zmqEndpoint: 'tcp://0.0.0.0'}}", "zmqEndpoint"),
    ("{kvEventsConfig: {zmqEndpoint: 'tcp://0.0.0.0:70000'}}", "zmqEndpoint"),
    ("{kvEventsConfig: {discoverPods: 'no'}}", "discoverPods"),
    ("{kvEventsConfig: {socketPort: 5556}}", "socketPort"),  # belongs in podDiscoveryConfig
    ("{speculativeIndexing: true, speculativeTTL: 0}", "speculativeTTL"),
    ("{speculativeTTL: 'soon'}", "speculativeTTL"),
    ("{tokenProcessorConfig: {blockSize: 0}}", "blockSize"),
    ("{indexerConfig: {kvBlockIndexConfig: {metricsLoggingInterval: 'soon'}}}",
     "metricsLoggingInterval"),
    ("{indexerConfig: {kvBlockIndexConfig: {metricsLoggingInterval: -1}}}",
     "metricsLoggingInterval"),
    ("{indexerConfig: {kvBlockIndexConfig: {redisConfig: {address: x}}}}", "redisConfig"),
    ("{tokenProcessorConfig: {blockSize: '16'}}", "blockSize"),
])
def test_unsupported_or_wrong_parameters_are_refused_by_name(parameters: str,
                                                            message: str) -> None:
    with pytest.raises(ConfigError) as e:
        build(parse_config(scorer_config(parameters), source="x.yaml"), store())
    assert "x.yaml" in str(e.value) and message in str(e.value)


@pytest.mark.parametrize(("parameters", "message"), [
    ("{vllm: {url: 'http://x:8000'}}", "modelName"),
    ("{modelName: m, vllm: {http: 'localhost:8000'}}", "vllm.http"),
    ("{modelName: m, vllm: {url: 'localhost:8000'}}", "vllm.url"),
    ("{modelName: m, vllm: {url: 'http://a', http: 'http://b'}}", "not both"),
    ("{estimate: {image: {mode: static}}}", "multimodal"),
    ("{modelName: m, vllm: {grpc: 'x'}}", "grpc"),
    ("{modelName: m, vllm: {timeout: 0}}", "vllm.timeout"),
])
def test_token_producer_refuses_bad_parameters(parameters: str, message: str) -> None:
    text = scorer_config(extra=f"- type: token-producer\n  parameters: {parameters}\n")
    with pytest.raises(ConfigError) as e:
        build(parse_config(text, source="t.yaml"), store())
    assert "t.yaml" in str(e.value) and message in str(e.value)


def test_an_endpoint_notification_source_feeding_other_extractors_is_refused() -> None:
    text = scorer_config(extra="""\
- type: endpoint-notification-source
- type: core-metrics-extractor
dataLayer:
  sources:
  - pluginRef: endpoint-notification-source
    extractors: [{pluginRef: core-metrics-extractor}]
""")
    with pytest.raises(ConfigError, match=r"dataLayer\.sources"):
        build(parse_config(text), store())


def test_approximate_producer_switches_to_token_blocks_once_ids_arrive() -> None:
    """token-producer sets ids at admission, after the producer step: the approximate
    scorer's match is redone on token blocks then (its token-id path is reachable)."""
    from epp.scheduling.plugins.prefix.producer import (
        ApproxPrefixCacheProducer,
        PrefixCacheParameters,
    )
    from epp.scheduling.request import LLMRequest

    producer = ApproxPrefixCacheProducer("p", PrefixCacheParameters(block_size_tokens=4))
    req = LLMRequest("r", "m", prompt=b"x" * 64)
    before = producer.match(req)
    assert not before.tokens and len(before.hashes) == 4  # 64 bytes = 4 blocks of 16 bytes
    req.prompt_token_ids = list(range(40))
    after = producer.match(req)
    assert after.tokens and len(after.hashes) == 10 and after.hashes != before.hashes
    assert producer.match(req) is after  # computed once per kind
