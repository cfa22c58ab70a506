"""The inferencepool chart's default EndpointPickerConfig: upstream v1.5.0's (data-layer
plugins spelled out) plus ours, ``prefill-load-scorer`` (as the EPP's own default), rendered
with the real helm, loaded by the real EPP, and scraping exactly as the EPP did when the
config left the data layer implicit."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from epp.config import build, parse_config
from epp.datalayer import CoreMetricsExtractor, MetricsDataSource
from epp.main import settings
from epp.requestcontrol.parser_chain import ParserChain
from epp.requestcontrol.plugins import OpenAIParser, VllmGrpcParser
from epp.requestcontrol.plugins.predicted_latency_producer import PredictedLatencyProducer
from epp.requestcontrol.plugins.vertexai_parser import VertexAIParser
from tests.charts.render import one, refusal, render
from tests.charts.test_charts import validate_rendered
from tests.charts.test_values import epp, parse

PROFILE = [{"name": "default", "plugins": [
    {"pluginRef": "queue-scorer", "weight": 2},
    {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
    {"pluginRef": "prefix-cache-scorer", "weight": 3},
    {"pluginRef": "prefill-load-scorer", "weight": 1}]}]
SCRAPE = {"type": "metrics-data-source",
          "parameters": {"scheme": "http", "path": "/metrics", "insecureSkipVerify": True}}


def upstream(*extra: dict[str, Any], engine: str | None = None,
             parser: str | None = None) -> dict[str, Any]:
    """What upstream v1.5.0's chart renders as default-plugins.yaml (``helm template`` of
    config/charts/inferencepool at v1.5.0, read back as YAML), plus ``prefill-load-scorer``
    (docs/epp.md, "The default profile")."""
    core: dict[str, Any] = {"type": "core-metrics-extractor"}
    if engine:
        core["parameters"] = {"defaultEngine": engine}
    config: dict[str, Any] = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
        "plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"},
                    {"type": "prefix-cache-scorer"}, {"type": "prefill-load-scorer"}, SCRAPE,
                    core, *extra],
        "schedulingProfiles": PROFILE}
    if parser:
        config["parser"] = {"pluginRef": parser}
    return config


def config_text(objs: list[dict[str, Any]]) -> str:
    return str(one(objs, "ConfigMap")["data"]["default-plugins.yaml"])


@pytest.mark.parametrize(("sets", "expected"), [
    ((), upstream()),
    (("inferencePool.modelServerType=sglang",), upstream(engine="sglang")),
    (("inferencePool.modelServerType=triton-tensorrt-llm",),
     upstream(engine="triton-tensorrt-llm")),
    (("inferencePool.modelServerProtocol=grpc",),
     upstream({"type": "vllmgrpc-parser"}, parser="vllmgrpc-parser")),
    (("inferencePool.parser=passthrough-parser",),
     upstream({"type": "passthrough-parser"}, parser="passthrough-parser")),
], ids=["vllm", "sglang", "triton", "vllm-grpc", "parser"])
def test_default_config_is_upstreams_and_prefill_load(sets: tuple[str, ...],
                                                      expected: dict[str, Any]) -> None:
    assert yaml.safe_load(config_text(render("inferencepool", *sets))) == expected


def runtime(sets: tuple[str, ...], *, implicit: bool = False) -> Any:
    """The EPP built from the chart's rendered config and args. ``implicit``: the config
    without the data-layer plugins, as the chart rendered it before (the EPP then adds
    metrics-data-source + core-metrics-extractor with defaults taken from the flags)."""
    objs = render("inferencepool", *sets)
    doc = yaml.safe_load(config_text(objs))
    if implicit:
        doc["plugins"] = [p for p in doc["plugins"] if p["type"] not in (
            "metrics-data-source", "core-metrics-extractor")]
    return build(parse_config(yaml.safe_dump(doc), source="chart"),
                 settings=settings(parse("epp", epp(objs)["args"])))


def scraping(rt: Any) -> tuple[Any, Any]:
    (source,) = rt.handle.find(MetricsDataSource)
    (extractor,) = rt.handle.find(CoreMetricsExtractor)
    assert source.extractors == [extractor]  # wired although the config has no dataLayer
    return source.config, extractor.default


@pytest.mark.parametrize("sets", [
    (),
    ("inferenceExtension.metricsDataSource.path=/stats",),
    ("inferenceExtension.metricsDataSource.scheme=https",
     "inferenceExtension.metricsDataSource.insecureSkipVerify=false"),
    ("inferenceExtension.metricsDataSource.scheme=https",),
    ("inferenceExtension.flags.model-server-metrics-path=/mine",),
    ("inferenceExtension.flags.model-server-metrics-scheme=https",
     "inferenceExtension.flags.model-server-metrics-https-insecure-skip-verify=false"),
    ("inferencePool.modelServerProtocol=grpc",),
], ids=["default", "path", "https-verified", "https", "flag-path", "flag-scheme", "grpc"])
def test_vllm_pools_scrape_exactly_as_before(sets: tuple[str, ...]) -> None:
    assert scraping(runtime(sets)) == scraping(runtime(sets, implicit=True))


@pytest.mark.parametrize("engine", ["sglang", "triton-tensorrt-llm", "trtllm-serve"])
def test_other_engines_read_the_same_load_metrics_as_before(engine: str) -> None:
    """Same page, same path, same load families; what changes (as upstream's
    ``defaultEngine``) is that unlabelled pods' cache configuration is read in the engine's
    own dialect rather than vLLM's with renamed families."""
    sets = (f"inferencePool.modelServerType={engine}",)
    (new_scrape, new), (old_scrape, old) = scraping(runtime(sets)), scraping(
        runtime(sets, implicit=True))
    assert new_scrape == old_scrape
    assert (new.waiting, new.running, new.kv_usage) == (old.waiting, old.running, old.kv_usage)
    assert new.engine.value == engine


def test_a_metrics_flag_in_values_still_wins() -> None:
    rt = runtime(("inferenceExtension.flags.model-server-metrics-path=/mine",
                  "inferenceExtension.metricsDataSource.path=/stats"))
    assert scraping(rt)[0].path == "/mine"


def test_vllm_grpc_pool_speaks_h2c_and_parses_vllms_grpc_api() -> None:
    objs = render("inferencepool", "inferencePool.modelServerProtocol=grpc")
    validate_rendered(objs)
    assert one(objs, "InferencePool")["spec"]["appProtocol"] == "kubernetes.io/h2c"
    assert isinstance(runtime(("inferencePool.modelServerProtocol=grpc",)).parser,
                      VllmGrpcParser)
    http = render("inferencepool")
    assert one(http, "InferencePool")["spec"]["appProtocol"] == "http"
    parsers = runtime(()).parser  # upstream v0.10's default list
    assert isinstance(parsers, ParserChain)
    assert [p.type_name for p, _ in parsers.entries] == [
        "openai-parser", "anthropic-parser", "vllmhttp-parser"]
    assert isinstance(parsers.fallback, OpenAIParser)


@pytest.mark.parametrize("sets", [
    ("inferencePool.parsers={vllmhttp-parser,anthropic-parser,openai-parser}",),
    ("router.epp.parsers={vllmhttp-parser,anthropic-parser,openai-parser}",),  # llm-d v0.10
])
def test_several_parsers_are_chosen_by_path_in_the_order_given(sets: tuple[str, ...]) -> None:
    chain = runtime(sets).parser
    assert isinstance(chain, ParserChain)
    assert [p.type_name for p, _ in chain.entries] == [
        "vllmhttp-parser", "anthropic-parser", "openai-parser"]


def test_one_parser_reads_every_path_as_gies_parser_section() -> None:
    assert isinstance(runtime(("inferencePool.parsers={vertexai-parser}",)).parser,
                      VertexAIParser)


def test_vllm_grpc_pool_on_gke_health_checks_vllms_grpc_health_method() -> None:
    objs = render("inferencepool", "inferencePool.modelServerProtocol=grpc", "provider.name=gke")
    check = one(objs, "HealthCheckPolicy")["spec"]["default"]["config"]
    assert check["type"] == "GRPC"
    assert check["grpcHealthCheck"]["grpcServiceName"] == (
        "/vllm.grpc.engine.VllmEngine/HealthCheck")
    assert check["grpcHealthCheck"]["port"] == 8000
    http = one(render("inferencepool", "provider.name=gke"), "HealthCheckPolicy")
    assert http["spec"]["default"]["config"]["type"] == "HTTP"


def test_grpc_with_another_engine_is_refused_saying_why() -> None:
    err = refusal("inferencepool", "inferencePool.modelServerProtocol=grpc",
                  "inferencePool.modelServerType=sglang")
    assert "modelServerProtocol=grpc is vLLM's gRPC API" in err


LATENCY_PLUGINS = [
    {"type": "predicted-latency-producer"},
    {"name": "strict-affinity-filter", "type": "prefix-cache-affinity-filter",
     "parameters": {"affinityThreshold": 0.99}},
    {"name": "loose-affinity-filter", "type": "prefix-cache-affinity-filter",
     "parameters": {"affinityThreshold": 0.80}},
    {"type": "latency-scorer"}, {"type": "weighted-random-picker"},
    {"type": "slo-headroom-tier-filter"}, {"type": "latency-slo-admitter"}]
LATENCY_PROFILE = [{"name": "default", "plugins": [
    {"pluginRef": p} for p in ("predicted-latency-producer", "strict-affinity-filter",
                               "slo-headroom-tier-filter", "loose-affinity-filter",
                               "latency-scorer", "weighted-random-picker")]}]


def test_latency_predictor_renders_upstreams_latency_profile_with_the_model_in_the_epp() -> None:
    """latencyPredictor.enabled: the default config is upstream v1.5.0's latency one (its
    chart, config/charts/epplib/templates/_config.yaml), and the EPP builds and runs it; the
    training/prediction sidecars upstream adds are not needed (the model is in process)."""
    sets = ("inferenceExtension.latencyPredictor.enabled=true",
            "inferenceExtension.latencyPredictor.predictionServers.count=2")
    objs = render("inferencepool", *sets)
    expected = upstream(*LATENCY_PLUGINS)
    expected["schedulingProfiles"] = LATENCY_PROFILE
    assert yaml.safe_load(config_text(objs)) == expected
    rt = runtime(sets)
    assert [type(p).__name__ for p in rt.handle.find(PredictedLatencyProducer)] == [
        "PredictedLatencyProducer"]
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["epp"]
    validate_rendered(objs)


def test_latency_predictor_with_disaggregation_is_refused_saying_why() -> None:
    """The P/D config file the EPP then loads has no latency plugins: the latency profile
    would be rendered and never used."""
    err = refusal("inferencepool", "inferenceExtension.latencyPredictor.enabled=true",
                  "disaggregation.enabled=true")
    assert "the P/D config the EPP loads has no latency plugins" in err
    # A config file of the user's own is loaded instead: nothing is lost, nothing refused.
    objs = render("inferencepool", "inferenceExtension.latencyPredictor.enabled=true",
                  "disaggregation.enabled=true",
                  "inferenceExtension.pluginsConfigFile=mine.yaml",
                  "inferenceExtension.pluginsCustomConfig.mine\\.yaml=plugins: []")
    assert "--config-file=/config/mine.yaml" in epp(objs)["args"]
