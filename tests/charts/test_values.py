"""Both charts take upstream GIE v1.5.0's values (and v1.0's list form of ``flags``): each
upstream key is rendered as upstream renders it, or refused with a message that says why;
``values.schema.json`` refuses keys neither chart knows.

The files under ``upstream/`` hold every key of upstream's values files with its default.
Where the chart renders an upstream flag or plugin type the ``epp``/``bbr`` does not take yet,
the single test that feeds it to the real parser says so (it was ``xfail(strict=True)`` until
issue 13's flags and plugin types landed).
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.charts.render import container, one, refusal, render
from tests.charts.test_charts import crd_schema, validate_rendered
from tests.support.helm import REPO

UPSTREAM = Path(__file__).parent / "upstream"
IP_VALUES = UPSTREAM / "inferencepool-v1.5.0.yaml"
BBR_VALUES = UPSTREAM / "body-based-routing-v1.5.0.yaml"
GIE_MIRROR = Path("/work/.mirror/kubernetes-sigs+gateway-api-inference-extension/repo")


def parse(prog: str, args: list[str]) -> Any:
    """Parse ``args`` with the real ``epp``/``bbr`` parser; a refusal fails with its message."""
    if prog == "epp":
        from epp.main import parser
    else:
        from bbr.main import parser  # type: ignore[assignment]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser().parse_args(args)
    except SystemExit:
        message = err.getvalue().strip()
        raise AssertionError(f"{prog} refuses its rendered args: {message}") from None


def epp(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return container(objs, "epp")


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# -- upstream's values files, whole ---------------------------------------------------------


def keys(tree: Any, prefix: str = "") -> set[str]:
    if not isinstance(tree, dict):
        return {prefix}
    out = {prefix} if prefix else set()
    for k, v in tree.items():
        out |= keys(v, f"{prefix}.{k}" if prefix else k)
    return out


@pytest.mark.parametrize(("ours", "theirs"), [
    (IP_VALUES, "config/charts/inferencepool/values.yaml"),
    (BBR_VALUES, "config/charts/body-based-routing/values.yaml"),
])
def test_upstream_values_files_here_hold_every_upstream_key(ours: Path, theirs: str) -> None:
    if not GIE_MIRROR.exists():
        pytest.skip("the upstream GIE mirror is not on this machine; the files were written "
                    "from it at v1.5.0")
    text = subprocess.run(["git", "-C", str(GIE_MIRROR), "show", f"v1.5.0:{theirs}"],
                          capture_output=True, text=True, check=True).stdout
    assert keys(yaml.safe_load(ours.read_text())) == keys(yaml.safe_load(text))


@pytest.mark.parametrize("provider", ["none", "istio", "gke"])
def test_inferencepool_renders_upstreams_values_file(provider: str) -> None:
    objs = render("inferencepool", f"provider.name={provider}",
                  values=[IP_VALUES, UPSTREAM / "latency-predictor-defaults.yaml"])
    validate_rendered(objs)
    c = epp(objs)
    assert c["image"] == "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    assert c["imagePullPolicy"] == "Always"
    assert one(objs, "InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    assert parse("epp", c["args"]).verbosity == 1


@pytest.mark.parametrize("provider", ["none", "istio", "gke"])
def test_bbr_renders_upstreams_values_file(provider: str) -> None:
    objs = render("body-based-routing", f"provider.name={provider}", values=[BBR_VALUES])
    validate_rendered(objs)
    c = container(objs, "bbr")
    assert c["image"] == "registry.k8s.io/gateway-api-inference-extension/bbr:v1.5.0"
    plugins = [a for a in c["args"] if a.startswith("--plugin=")]
    assert plugins == [
        '--plugin=body-field-to-header:model-extractor:'
        '{"fieldName":"model","headerName":"X-Gateway-Model-Name"}',
        "--plugin=base-model-to-header:base-model-mapper"]
    assert "--v=3" in c["args"]


def test_bbr_takes_upstreams_default_plugins() -> None:
    objs = render("body-based-routing", values=[BBR_VALUES])
    from bbr.basemodels import StaticBaseModels
    from bbr.plugins import build

    plugins = build(parse("bbr", container(objs, "bbr")["args"]).plugin, StaticBaseModels())
    assert [p.type_name for p in plugins] == ["body-field-to-header", "base-model-to-header"]
    assert plugins[0].params.field == "model"  # upstream's fieldName


# -- inferenceExtension ---------------------------------------------------------------------


def test_failure_mode_is_upstreams_and_honoured() -> None:
    pool = one(render("inferencepool"), "InferencePool")
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"  # upstream's default
    pool = one(render("inferencepool", "inferenceExtension.failureMode=FailClose"),
               "InferencePool")
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    # This chart's earlier key still wins when given.
    pool = one(render("inferencepool", "inferencePool.endpointPickerRef.failureMode=FailClose"),
               "InferencePool")
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    legacy = one(render("inferencepool", "inferenceExtension.failureMode=FailClose",
                        "inferencePool.apiVersion=inference.networking.x-k8s.io/v1alpha2"),
                 "InferencePool")
    assert legacy["spec"]["extensionRef"]["failureMode"] == "FailClose"


def test_image_keys_upstream_and_ours() -> None:
    c = epp(render("inferencepool", "inferenceExtension.image.registry=r.example",
                   "inferenceExtension.image.repository=team/epp",
                   "inferenceExtension.image.tag=v9"))
    assert c["image"] == "r.example/team/epp:v9"
    c = epp(render("inferencepool", "inferenceExtension.image.hub=h.example/x"))
    assert c["image"].startswith("h.example/x/epp:")
    c = container(render("body-based-routing", "bbr.image.registry=r.example",
                         "bbr.image.repository=team/bbr", "bbr.image.tag=v9"), "bbr")
    assert c["image"] == "r.example/team/bbr:v9"


def test_flags_map_and_v1_list_form_render_the_same_args() -> None:
    as_map = epp(render("inferencepool", "inferenceExtension.flags.v=1",
                        "inferenceExtension.flags.refresh-metrics-interval=100ms"))["args"]
    as_list = epp(render("inferencepool", values=[UPSTREAM / "v1.0-flags-list.yaml"]))["args"]
    assert sorted(as_list) == sorted(as_map)  # a map renders sorted, a list in order
    args = parse("epp", as_list)
    assert (args.verbosity, args.refresh_metrics_interval) == (1, 0.1)
    bbr_list = container(render("body-based-routing", "bbr.flags[0].name=v",
                                "bbr.flags[0].value=2"), "bbr")["args"]
    assert parse("bbr", bbr_list).verbosity == 2


def test_large_payload_limits_are_set_by_values_and_taken_by_both_services() -> None:
    """Issue 29: a multimodal pool raises the body cap and the gRPC message limits through
    the charts' flags (docs/kubernetes.md, large payloads); the services parse the sizes."""
    sizes = ("max-body-bytes=32MiB", "grpc-max-recv-msg-size=34MiB",
             "grpc-max-send-msg-size=34MiB")
    ep = parse("epp", epp(render("inferencepool",
                                 *(f"inferenceExtension.flags.{s}" for s in sizes)))["args"])
    bb = parse("bbr", container(render("body-based-routing",
                                       *(f"bbr.flags.{s}" for s in sizes)), "bbr")["args"])
    for args in (ep, bb):
        assert (args.max_body_bytes, args.grpc_max_recv_msg_size,
                args.grpc_max_send_msg_size) == (32 << 20, 34 << 20, 34 << 20)


@pytest.mark.parametrize(("engine", "metric"), [
    ("sglang", "sglang:num_queue_reqs"),
    ("triton-tensorrt-llm", "nv_trt_llm_request_metrics{request_type=waiting}"),
    ("trtllm-serve", "trtllm_num_requests_waiting"),
])
def test_model_server_types_render_upstreams_metric_flags(engine: str, metric: str) -> None:
    objs = render("inferencepool", f"inferencePool.modelServerType={engine}")
    validate_rendered(objs)
    assert f"--total-queued-requests-metric={metric}" in epp(objs)["args"]
    if engine == "trtllm-serve":
        assert "--model-server-metrics-path=/prometheus/metrics" in epp(objs)["args"]


@pytest.mark.parametrize(("engine", "family"), [
    ("sglang", "sglang:num_queue_reqs"),
    ("triton-tensorrt-llm", "nv_trt_llm_request_metrics"),
    ("trtllm-serve", "trtllm_num_requests_waiting"),
])
def test_epp_takes_the_metric_flags_of_other_model_server_types(engine: str, family: str) -> None:
    from epp.config import build, parse_config
    from epp.datalayer import CoreMetricsExtractor
    from epp.main import settings

    args = parse("epp", epp(render("inferencepool",
                                   f"inferencePool.modelServerType={engine}"))["args"])
    runtime = build(parse_config(None), settings=settings(args))
    (extractor,) = runtime.handle.find(CoreMetricsExtractor)
    assert extractor.default.waiting == family  # unlabelled pods are read as that engine


def test_model_server_type_outside_upstreams_list_is_refused() -> None:
    assert "modelServerType" in refusal("inferencepool", "inferencePool.modelServerType=tgi")


def test_metrics_data_source_path_is_a_real_flag() -> None:
    args = parse("epp", epp(render(
        "inferencepool", "inferenceExtension.metricsDataSource.path=/stats"))["args"])
    assert args.model_server_metrics_path == "/stats"


def test_epp_takes_the_https_metrics_scheme() -> None:
    c = epp(render("inferencepool", "inferenceExtension.metricsDataSource.scheme=https"))
    assert "--model-server-metrics-scheme=https" in c["args"]
    assert parse("epp", c["args"]).model_server_metrics_scheme == "https"


def test_tracing_renders_upstreams_environment() -> None:
    c = epp(render("inferencepool", "inferenceExtension.tracing.enabled=true",
                   "inferenceExtension.tracing.otelExporterEndpoint=http://otel:4317"))
    assert "--tracing=true" in c["args"]
    env = env_of(c)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel:4317"
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    assert "--tracing=true" not in epp(render("inferencepool"))["args"]
    b = container(render("body-based-routing", "bbr.tracing.enabled=true"), "bbr")
    assert "--tracing=true" in b["args"]
    assert env_of(b)["OTEL_SERVICE_NAME"] == "gateway-api-inference-extension/bbr"


def test_epp_takes_the_tracing_flag() -> None:
    args = parse("epp", epp(render("inferencepool",
                                   "inferenceExtension.tracing.enabled=true"))["args"])
    assert args.tracing is True  # accepted; docs/compatibility.md says what it does here


def test_bbr_takes_the_tracing_flag() -> None:
    args = parse("bbr", container(render("body-based-routing", "bbr.tracing.enabled=true"),
                                  "bbr")["args"])
    assert args.tracing is True


def test_prometheus_auth_shares_one_token_between_prometheus_and_the_epp() -> None:
    objs = render("inferencepool", "inferenceExtension.monitoring.prometheus.enabled=true",
                  "inferenceExtension.monitoring.prometheus.extraLabels.team=ml")
    validate_rendered(objs)
    secret = one(objs, "Secret")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == (
        one(objs, "ServiceAccount")["metadata"]["name"])
    monitor = one(objs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["team"] == "ml"
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"] == {
        "name": secret["metadata"]["name"], "key": "token"}
    c = epp(objs)
    token_file = parse("epp", c["args"]).metrics_bearer_token_file
    (mount,) = [m for m in c["volumeMounts"] if token_file.startswith(m["mountPath"] + "/")]
    volumes = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (vol,) = [v for v in volumes if v["name"] == mount["name"]]
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    assert token_file.endswith("/token")


def test_prometheus_without_auth_has_no_token() -> None:
    objs = render("inferencepool", "inferenceExtension.monitoring.prometheus.enabled=true",
                  "inferenceExtension.monitoring.prometheus.auth.enabled=false")
    assert not [o for o in objs if o["kind"] == "Secret"]
    assert "authorization" not in one(objs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert parse("epp", epp(objs)["args"]).metrics_bearer_token_file is None


@pytest.mark.parametrize(("autopilot", "gmp"), [("false", "gmp-system"),
                                               ("true", "gke-gmp-system")])
def test_prometheus_on_gke_is_a_pod_monitoring_sharing_the_token(autopilot: str,
                                                                 gmp: str) -> None:
    """Google's managed Prometheus scrapes the EPP pods with the token the EPP accepts; its
    collector may read that one Secret."""
    objs = render("inferencepool", "provider.name=gke", f"provider.gke.autopilot={autopilot}",
                  "inferenceExtension.monitoring.prometheus.enabled=true")
    validate_rendered(objs)
    assert not [o for o in objs if o["kind"] == "ServiceMonitor"]
    monitor = one(objs, "PodMonitoring")
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["endpoints"]
    ports = {p["name"]: p["containerPort"] for p in epp(objs)["ports"]}
    assert ports[endpoint["port"]] == parse("epp", epp(objs)["args"]).metrics_port
    secret = one(objs, "Secret")["metadata"]["name"]
    assert endpoint["authorization"]["credentials"]["secret"] == {"name": secret, "key": "token"}
    volumes = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert any(v.get("secret", {}).get("secretName") == secret for v in volumes)
    assert parse("epp", epp(objs)["args"]).metrics_bearer_token_file
    role = next(o for o in objs if o["kind"] == "Role"
                and o["metadata"]["name"].endswith("metrics-token-read"))
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": [secret], "verbs": ["get", "list", "watch"]}]
    binding = next(o for o in objs if o["kind"] == "RoleBinding"
                   and o["roleRef"]["name"] == role["metadata"]["name"])
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "collector",
                                    "namespace": gmp}]


def test_prometheus_on_gke_without_auth_has_no_token_rbac() -> None:
    objs = render("inferencepool", "provider.name=gke",
                  "inferenceExtension.monitoring.prometheus.enabled=true",
                  "inferenceExtension.monitoring.prometheus.auth.enabled=false")
    assert "authorization" not in one(objs, "PodMonitoring")["spec"]["endpoints"][0]
    assert not [o for o in objs if o["kind"] == "Secret"]
    assert parse("epp", epp(objs)["args"]).metrics_bearer_token_file is None


def test_extra_ports_volumes_and_mounts_render() -> None:
    objs = render("inferencepool", values=[UPSTREAM / "extras.yaml"])
    validate_rendered(objs)
    c = epp(objs)
    assert {"name": "zmq", "containerPort": 5557, "protocol": "TCP"} in c["ports"]
    svc_ports = one(objs, "Service")["spec"]["ports"]
    assert {"name": "zmq", "port": 5557, "protocol": "TCP"} in svc_ports
    assert {"name": "extra", "mountPath": "/extra"} in c["volumeMounts"]
    volumes = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "extra", "emptyDir": {}} in volumes


def test_sidecar_renders_as_upstream() -> None:
    objs = render("inferencepool", values=[UPSTREAM / "sidecar.yaml"])
    validate_rendered(objs)
    side = container(objs, "routing-sidecar")
    assert side["image"] == "ghcr.io/example/sidecar:1"
    assert side["command"] == ["/app/sidecar"]
    assert side["args"] == ["--port=8000", "--vllm-port=8200"]
    assert side["readinessProbe"]["tcpSocket"]["port"] == 8000
    assert one(objs, "ConfigMap", "sidecar-config")["data"] == {"mode": "pd"}
    volumes = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "sidecar-config", "configMap": {"name": "sidecar-config"}} in volumes
    epp(objs)  # the EPP is still there, unchanged


def test_sidecar_without_image_is_refused() -> None:
    err = refusal("inferencepool", "inferenceExtension.sidecar.enabled=true",
                  "inferenceExtension.sidecar.name=s")
    assert "inferenceExtension.sidecar.image is required" in err


# -- inferencePool, routes, objectives, providers -------------------------------------------


def test_parser_renders_into_a_config_the_epp_loads() -> None:
    from epp.config import build, parse_config

    cm = one(render("inferencepool", "inferencePool.parser=openai-parser"), "ConfigMap")
    text = cm["data"]["default-plugins.yaml"]
    assert "pluginRef: openai-parser" in text
    runtime = build(parse_config(text, source="chart"))
    assert runtime.parser.type_name == "openai-parser"


def test_legacy_target_port_number() -> None:
    pool = one(render("inferencepool",
                      "inferencePool.apiVersion=inference.networking.x-k8s.io/v1alpha2",
                      "inferencePool.targetPortNumber=8123"), "InferencePool")
    assert pool["spec"]["targetPortNumber"] == 8123


@pytest.mark.parametrize("provider", ["none", "istio", "gke"])
def test_experimental_http_route_points_the_gateway_at_the_pool(provider: str) -> None:
    objs = render("inferencepool", "experimentalHttpRoute.enabled=true",
                  "experimentalHttpRoute.baseModel=llama", f"provider.name={provider}")
    validate_rendered(objs)
    route = one(objs, "HTTPRoute")["spec"]
    assert route["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                    "name": "inference-gateway"}]
    (rule,) = route["rules"]
    pool = one(objs, "InferencePool")
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io",
                                    "kind": "InferencePool",
                                    "name": pool["metadata"]["name"]}]
    assert rule["matches"][0]["headers"] == [
        {"type": "Exact", "name": "X-Gateway-Base-Model-Name", "value": "llama"}]
    # GKE's gateway rejects route timeouts; upstream leaves them out there.
    assert ("timeouts" in rule) == (provider != "gke")
    assert not [o for o in render("inferencepool") if o["kind"] == "HTTPRoute"]


def test_http_route_passes_only_the_inference_paths() -> None:
    """Issue 31: the servers' admin paths are not routed (upstream routes PathPrefix /)."""
    objs = render("inferencepool", "experimentalHttpRoute.enabled=true",
                  "experimentalHttpRoute.baseModel=llama")
    validate_rendered(objs)
    (rule,) = one(objs, "HTTPRoute")["spec"]["rules"]
    paths = {m["path"]["value"]: m["path"]["type"] for m in rule["matches"]}
    assert paths["/v1/chat/completions"] == paths["/v1/completions"] == "Exact"
    assert not {"/", "/metrics", "/v1/unload_lora_adapter", "/reset_prefix_cache"} & set(paths)
    assert all(m["headers"][0]["value"] == "llama" for m in rule["matches"])
    custom = render("inferencepool", "experimentalHttpRoute.enabled=true",
                    "experimentalHttpRoute.paths={/v1/completions,/openai/}")
    (rule,) = one(custom, "HTTPRoute")["spec"]["rules"]
    assert [m["path"] for m in rule["matches"]] == [
        {"type": "Exact", "value": "/v1/completions"},
        {"type": "PathPrefix", "value": "/openai/"}]


def test_inference_objectives_are_created_for_the_pool() -> None:
    objs = render("inferencepool", "inferenceObjectives[0].name=high",
                  "inferenceObjectives[0].priority=5", "inferenceObjectives[1].name=plain")
    objectives = {o["metadata"]["name"]: o for o in objs if o["kind"] == "InferenceObjective"}
    assert set(objectives) == {"high", "plain"}
    schema = crd_schema("inference.networking.x-k8s.io", "inferenceobjectives", "v1alpha2")
    for o in objectives.values():
        jsonschema.validate(o, schema)
        assert o["spec"]["poolRef"]["name"] == one(objs, "InferencePool")["metadata"]["name"]
    assert objectives["high"]["spec"]["priority"] == 5
    assert "priority" not in objectives["plain"]["spec"]


def test_istio_destination_rule_from_upstreams_keys_keeps_tls() -> None:
    objs = render("inferencepool", "provider.name=istio",
                  "provider.istio.destinationRule.trafficPolicy.connectionPool.http"
                  ".maxRequestsPerConnection=256000",
                  "istio.destinationRule.host=epp.example")
    spec = one(objs, "DestinationRule")["spec"]
    assert spec["host"] == "epp.example"
    assert spec["trafficPolicy"] == {
        "tls": {"mode": "SIMPLE", "insecureSkipVerify": True},
        "connectionPool": {"http": {"maxRequestsPerConnection": 256000}}}


def test_bbr_multi_namespace_is_upstreams_all_namespaces() -> None:
    objs = render("body-based-routing", "bbr.multiNamespace=true")
    assert one(objs, "ClusterRole")["rules"][0]["resources"] == ["configmaps"]
    assert parse("bbr", container(objs, "bbr")["args"]).configmap_namespace == ""


# -- values.schema.json ---------------------------------------------------------------------


@pytest.mark.parametrize(("chart", "setting", "message"), [
    ("inferencepool", "inferenceExtension.colour=blue", "'colour' not allowed"),
    ("inferencepool", "surprise=1", "'surprise' not allowed"),
    ("inferencepool", "inferenceExtension.monitoring.prometheus.scrapeTimeout=5s",
     "'scrapeTimeout' not allowed"),
    ("inferencepool", "inferenceExtension.failureMode=Sometimes", "failureMode"),
    ("inferencepool", "inferencePool.targetPorts[0].number=0", "number"),
    ("inferencepool", "inferenceExtension.endpointsServer.createInferencePool=false",
     "'endpointsServer' not allowed"),
    ("body-based-routing", "bbr.colour=blue", "'colour' not allowed"),
    ("body-based-routing", "provider.istio.envoyFilter.priority=1", "'priority' not allowed"),
    ("body-based-routing", "bbr.plugins[0].type=x", "name"),
])
def test_schema_refuses_what_the_chart_does_not_know(chart: str, setting: str,
                                                     message: str) -> None:
    err = refusal(chart, setting)
    assert "schema" in err and message in err, err


def test_values_schemas_are_valid_json_schema() -> None:
    import json

    for chart in ("inferencepool", "body-based-routing"):
        schema = json.loads((REPO / "charts" / chart / "values.schema.json").read_text())
        jsonschema.Draft7Validator.check_schema(schema)
        defaults = yaml.safe_load((REPO / "charts" / chart / "values.yaml").read_text())
        jsonschema.validate(defaults, schema)


def test_route_retry_is_rendered_for_fallback_endpoints() -> None:
    """``experimentalHttpRoute.retry`` (ours): the rule's Gateway API retry, which is what
    walks the EPP's fallback list on override_host gateways (Istio, Envoy Gateway)."""
    route = one(render("inferencepool", "experimentalHttpRoute.enabled=true",
                       "experimentalHttpRoute.retry.attempts=2",
                       "experimentalHttpRoute.retry.backoff=100ms"), "HTTPRoute")
    assert route["spec"]["rules"][0]["retry"] == {"attempts": 2, "backoff": "100ms"}
    plain = one(render("inferencepool", "experimentalHttpRoute.enabled=true"), "HTTPRoute")
    assert "retry" not in plain["spec"]["rules"][0]


@pytest.mark.parametrize(("value", "where"), [
    ("experimentalHttpRoute.retry.tries=2", "additional properties 'tries'"),
    ("experimentalHttpRoute.retry.codes[0]=200", "/experimentalHttpRoute/retry/codes/0"),
])
def test_route_retry_outside_gateway_apis_shape_is_refused(value: str, where: str) -> None:
    assert where in refusal("inferencepool", "experimentalHttpRoute.enabled=true", value)
