"""Every upstream v1.5 section of the EndpointPickerConfig, strictly: what each one builds,
and the one-line error (file, path, reason) for what cannot be used."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from epp.config import (
    BUILTIN_PLUGINS,
    ConfigError,
    build,
    load_config_file,
    parse_config,
)
from epp.datalayer import CoreMetricsExtractor, Extractor, MetricsDataSource
from epp.datastore import Datastore, EndpointView, EngineType
from epp.handle import Settings
from epp.metrics import ScraperConfig
from epp.requestcontrol.parser_chain import ParserChain
from epp.requestcontrol.plugins import (
    ConcurrencyDetector,
    InflightLoadProducer,
    OpenAIParser,
    RequestMetricsRecorder,
    UtilizationDetector,
)
from epp.scheduling import Plugin
from epp.scheduling.plugins import PrefixCacheScorer
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from shared.plugins import PluginRegistry
from shared.tls import self_signed
from tests.epp.unit.test_epp_scraper import datastore_for, eventually

UPSTREAM_V15 = Path(__file__).parent.parent / "data" / "upstream-v1.5.0-default-plugins.yaml"


def error(text: str, source: str = "cfg.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        build(parse_config(text, source=source))
    return str(info.value)


def test_upstream_v15_chart_config_builds_its_data_layer_and_defaults() -> None:
    rt = build(load_config_file(UPSTREAM_V15))
    (source,) = rt.data_sources
    assert isinstance(source, MetricsDataSource)
    assert [type(e) for e in source.extractors] == [CoreMetricsExtractor]
    parsers = rt.parser  # upstream v0.10's default list
    assert isinstance(parsers, ParserChain)
    assert [p.type_name for p, _ in parsers.entries] == [
        "openai-parser", "anthropic-parser", "vllmhttp-parser"]
    assert isinstance(parsers.fallback, OpenAIParser)
    assert isinstance(rt.saturation, UtilizationDetector)
    assert [type(p) for p in rt.producers] == [ApproxPrefixCacheProducer]
    assert [type(p) for p in rt.response_complete] == [InflightLoadProducer,
                                                       RequestMetricsRecorder]


def test_a_typod_parameter_is_one_line_naming_file_path_and_parameter() -> None:
    msg = error("plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoint: 2}\n")
    assert "\n" not in msg
    assert msg.startswith("cfg.yaml: plugins[0]: ")
    assert "unknown parameters ['maxNumOfEndpoint']" in msg
    assert "maxNumOfEndpoints" in msg  # the known names are listed


def test_an_unknown_section_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"cfg\.yaml: shedulingProfiles: unknown section"):
        parse_config("shedulingProfiles: []\n", source="cfg.yaml")


def test_an_unknown_field_of_a_plugin_entry_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"plugins\[0\]: unknown field 'paramters'"):
        parse_config("plugins:\n- type: queue-scorer\n  paramters: {}\n")


def test_an_unknown_feature_gate_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"featureGates\[0\]: unknown feature gate 'fast'"):
        parse_config("featureGates: [fast]\n")


def test_flow_control_errors_name_the_path() -> None:
    assert error("featureGates: [flowControl]\nflowControl:\n  maxBytes: -1\n").endswith(
        "flowControl.maxBytes: must be non-negative, got -1")


def test_flow_control_shape_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"flowControl\.priorityBands\[0\]\.priority"):
        parse_config("flowControl:\n  priorityBands: [{priority: high}]\n")


def test_data_layer_section_wires_sources_to_extractors() -> None:
    text = """\
plugins:
- {type: metrics-data-source, name: scrape}
- {type: core-metrics-extractor, name: core}
dataLayer:
  sources: [{pluginRef: scrape, extractors: [{pluginRef: core}]}]
"""
    (source,) = build(parse_config(text)).data_sources
    assert (source.name, [e.name for e in source.extractors]) == ("scrape", ["core"])


def test_an_empty_data_layer_still_gets_the_default_metrics_source() -> None:
    # llm-d v0.10: the default source is added unless injectDefaults says no.
    (source,) = build(parse_config("dataLayer: {sources: []}\n")).data_sources
    assert source.type_name == "metrics-data-source"
    assert [e.type_name for e in source.extractors] == ["core-metrics-extractor"]


def test_inject_defaults_false_collects_nothing() -> None:
    text = "dataLayer: {sources: [], injectDefaults: false}\n"
    assert build(parse_config(text)).data_sources == ()


def test_a_metrics_source_without_a_core_extractor_is_an_error() -> None:
    text = "plugins:\n- type: metrics-data-source\ndataLayer:\n  sources: " \
           "[{pluginRef: metrics-data-source}]\n"
    assert "dataLayer.sources[0].extractors: metrics-data-source needs a " \
           "core-metrics-extractor" in error(text)


def test_a_data_source_ref_to_a_scorer_is_an_error() -> None:
    text = "plugins:\n- type: queue-scorer\ndataLayer:\n  sources: [{pluginRef: queue-scorer}]\n"
    assert "is not a DataSource" in error(text)


def test_metrics_source_parameters_win_over_the_flags() -> None:
    text = """\
plugins:
- type: metrics-data-source
  parameters: {scheme: https, path: /stats, insecureSkipVerify: false}
"""
    flags = Settings(scraper=ScraperConfig(interval=0.5, path="/flag", port=9100))
    (source,) = build(parse_config(text), settings=flags).data_sources
    assert isinstance(source, MetricsDataSource)
    c = source.config
    assert (c.scheme, c.path, c.insecure_skip_verify, c.interval, c.port) == (
        "https", "/stats", False, 0.5, 9100)


def test_a_scheme_other_than_http_or_https_is_an_error() -> None:
    msg = error("plugins:\n- type: metrics-data-source\n  parameters: {scheme: ftp}\n")
    assert "parameter 'scheme': must be one of 'http', 'https'" in msg


async def https_metrics_server(tmp_path: Path) -> tuple[web.AppRunner, int]:
    """A model-server-like /metrics over HTTPS with a self-signed certificate."""
    key, cert = self_signed("model-server")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    async def page(_: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting 7\nvllm:num_requests_running 1\n"
                                 "vllm:kv_cache_usage_perc 0.25\n")

    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx).start()
    return runner, runner.addresses[0][1]


@pytest.mark.parametrize(("skip_verify", "healthy"), [(True, True), (False, False)])
async def test_metrics_source_https_trusts_self_signed_servers_only_when_told(
        tmp_path: Path, raw_pool, raw_pod, skip_verify: bool, healthy: bool) -> None:
    runner, port = await https_metrics_server(tmp_path)
    try:
        ds: Datastore = datastore_for([port], raw_pool, raw_pod)
        text = ("plugins:\n- type: metrics-data-source\n  parameters: {scheme: https, "
                f"insecureSkipVerify: {str(skip_verify).lower()}}}\n")
        (source,) = build(parse_config(text), ds, Settings(
            scraper=ScraperConfig(interval=0.01, timeout=0.5))).data_sources
        assert isinstance(source, MetricsDataSource)
        view = ds.views()[0]
        async with source.scraper(ds):
            await eventually(lambda: view.metrics.waiting == 7 or not view.healthy)
        assert (view.healthy, view.metrics.waiting == 7) == (healthy, healthy)
    finally:
        await runner.cleanup()


def test_core_metrics_extractor_reads_unlabelled_pods_in_the_default_engine(
        make_view) -> None:
    text = "plugins:\n- type: core-metrics-extractor\n  parameters: {defaultEngine: sglang}\n"
    (source,) = build(parse_config(text)).data_sources
    (extractor,) = source.extractors
    assert isinstance(extractor, CoreMetricsExtractor)
    unlabelled = make_view(1)
    labelled = make_view(2, labels={"inference.networking.k8s.io/engine-type": "vllm"})
    assert (extractor.engine(unlabelled), extractor.engine(labelled)) == (
        EngineType.SGLANG, EngineType.VLLM)


def test_saturation_detector_section_picks_the_detector_plugin() -> None:
    text = """\
plugins:
- type: concurrency-detector
  parameters: {maxConcurrency: 2}
saturationDetector: {pluginRef: concurrency-detector}
"""
    assert isinstance(build(parse_config(text)).saturation, ConcurrencyDetector)


def test_saturation_detector_ref_to_a_scorer_is_an_error() -> None:
    text = "plugins:\n- type: queue-scorer\nsaturationDetector: {pluginRef: queue-scorer}\n"
    assert "saturationDetector.pluginRef: plugin 'queue-scorer' (queue-scorer) is not a " \
           "SaturationDetector" in error(text)


def test_legacy_saturation_thresholds_are_checked() -> None:
    assert "queueDepthThreshold: must be an integer > 0" in error(
        "saturationDetector: {queueDepthThreshold: 0}\n")


def test_parser_section_must_name_a_parser() -> None:
    text = "plugins:\n- type: queue-scorer\nparser: {pluginRef: queue-scorer}\n"
    assert "parser.pluginRef: plugin 'queue-scorer' (queue-scorer) is not a Parser" in error(text)


def test_a_configured_prefix_producer_feeds_the_scorer() -> None:
    text = """\
plugins:
- type: approx-prefix-cache-producer
  parameters: {blockSize: 32}
- type: prefix-cache-scorer
"""
    rt = build(parse_config(text))
    (scorer,) = [p for p in rt.handle if isinstance(p, PrefixCacheScorer)]
    (producer,) = rt.producers
    assert scorer.producer is producer and producer.params.block_size == 32


def test_prefix_parameters_on_the_scorer_beside_a_producer_are_refused() -> None:
    text = """\
plugins:
- type: prefix-cache-scorer
  parameters: {blockSize: 32}
- type: approx-prefix-cache-producer
"""
    assert "give the prefix parameters to the producer" in error(text)


def test_concurrency_detector_saturates_at_capacity_and_filters_above_headroom(
        make_view) -> None:
    text = "plugins:\n- type: concurrency-detector\n  parameters: {maxConcurrency: 2, " \
           "headroom: 0.5}\n"
    (detector,) = [p for p in build(parse_config(text)).handle
                   if isinstance(p, ConcurrencyDetector)]
    a, b = make_view(1), make_view(2)
    for _ in range(3):
        a.start_request(10)
    b.start_request(10)
    assert detector.saturation([a, b]) == 1.0 and detector.is_saturated([a, b])
    assert list(detector.filter(None, [a, b])) == [b]  # type: ignore[arg-type]


@dataclass(frozen=True)
class RunningLoras:
    """An attribute a third-party extractor makes from the same /metrics page."""

    count: int


class LoraCountExtractor(Plugin, Extractor):
    type_name = "lora-count-extractor"
    input_type = "prometheus-text"

    def extract(self, data: Any, view: EndpointView, now: float) -> RunningLoras:
        return RunningLoras(data.count("vllm:lora_requests_info"))


def test_extractors_beside_the_core_one_install_typed_attributes(make_view) -> None:
    text = """\
plugins:
- type: metrics-data-source
- type: core-metrics-extractor
- type: lora-count-extractor
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: core-metrics-extractor}, {pluginRef: lora-count-extractor}]
"""
    registry = PluginRegistry((*BUILTIN_PLUGINS, LoraCountExtractor))
    (source,) = build(parse_config(text), registry=registry).data_sources
    assert isinstance(source, MetricsDataSource)
    view = make_view(1)
    page = "vllm:num_requests_waiting 2\nvllm:lora_requests_info{a=\"b\"} 1\n"
    parsed = source.scraper(Datastore()).extract(page, view, 0.0)
    assert parsed.metrics.waiting == 2
    assert view.attribute(RunningLoras) == RunningLoras(1)
