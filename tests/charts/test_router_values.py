"""llm-d-router v0.10's chart values (its llm-d-router-gateway chart: `router.*`, `provider.*`,
`httpRoute.*`) given to charts/inferencepool with the real helm: read into this chart's keys,
or refused with the reason (templates/_router.tpl), never ignored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.render import container, one, refusal, render
from tests.charts.test_charts import epp_args

UPSTREAM_DEFAULTS = Path(__file__).parent / "upstream" / "llm-d-router-gateway-v0.10.0.yaml"


def write(tmp_path: Path, values: dict[str, Any]) -> list[Path]:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    return [f]


def test_upstreams_defaults_render_the_same_pool_as_ours() -> None:
    objs = render("inferencepool", values=[UPSTREAM_DEFAULTS])
    pool = one(objs, "InferencePool")
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    assert epp_args(objs).grpc_port == 9002
    assert container(objs)["resources"]["requests"] == {"cpu": "8", "memory": "8Gi"}


def test_a_router_values_file_is_read_into_this_charts_keys(tmp_path: Path) -> None:
    objs = render("inferencepool", values=write(tmp_path, {
        "router": {
            "epp": {"replicas": 2, "extProcPort": 9102, "grpcHealthPort": 9103,
                    "parsers": ["openai-parser"],
                    "env": [{"name": "EXTRA", "value": "1"}],
                    "flags": {"v": 3},
                    "pluginsConfigFile": "mine.yaml",
                    "pluginsCustomConfig": {"mine.yaml": "kind: EndpointPickerConfig\n"},
                    "metricsDataSource": {"path": "/custom-metrics"}},
            "modelServers": {"type": "sglang", "targetPorts": [{"number": 30000}],
                             "matchLabels": {"app": "sglang-llama"}},
            "inferencePool": {"create": True, "failureMode": "FailClose"},
            "inferenceObjectives": [{"name": "chat", "priority": 2}],
            "monitoring": {"interval": "30s", "prometheus": {"enabled": True}},
            "tracing": {"enabled": True, "otelExporterEndpoint": "http://otel:4317"},
        },
        "httpRoute": {"create": True, "inferenceGatewayName": "gw", "requestTimeout": "60s"},
    }))
    pool = one(objs, "InferencePool")
    assert pool["spec"]["selector"]["matchLabels"] == {"app": "sglang-llama"}
    assert pool["spec"]["targetPorts"] == [{"number": 30000}]
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    assert pool["spec"]["endpointPickerRef"]["port"]["number"] == 9102
    args = epp_args(objs)
    assert (args.grpc_port, args.grpc_health_port) == (9102, 9103)
    assert args.config_file == "/config/mine.yaml"
    assert one(objs, "Deployment")["spec"]["replicas"] == 2
    env = {e["name"]: e.get("value") for e in container(objs)["env"]}
    assert env["EXTRA"] == "1"
    objective = one(objs, "InferenceObjective")
    assert objective["apiVersion"] == "llm-d.ai/v1alpha2"  # as llm-d-router's chart renders it
    assert objective["spec"]["priority"] == 2
    route = one(objs, "HTTPRoute")
    assert route["spec"]["parentRefs"][0]["name"] == "gw"
    assert route["spec"]["rules"][0]["timeouts"]["request"] == "60s"
    assert one(objs, "ServiceMonitor")["spec"]["endpoints"][0]["interval"] == "30s"


def test_gie_objectives_keep_their_group_beside_routers(tmp_path: Path) -> None:
    objs = render("inferencepool", values=write(tmp_path, {
        "inferenceObjectives": [{"name": "old", "priority": 1}],
        "router": {"inferenceObjectives": [{"name": "new", "priority": 2}]}}))
    groups = {o["metadata"]["name"]: o["apiVersion"] for o in objs
              if o["kind"] == "InferenceObjective"}
    assert groups == {"old": "inference.networking.x-k8s.io/v1alpha2",
                      "new": "llm-d.ai/v1alpha2"}


@pytest.mark.parametrize(("values", "reason"), [
    ({"router": {"proxy": {"enabled": True}}}, "standalone Envoy proxy is not part"),
    ({"router": {"tokenizer": {"enabled": True}}}, "tokenizer sidecar is not rendered"),
    ({"router": {"epp": {"image": {"registry": "ghcr.io/llm-d",
                                   "repository": "llm-d-router-endpoint-picker"}}}},
     "is llm-d-router's Go EPP"),
    ({"router": {"inferencePool": {"create": False}}}, "--endpoint-selector"),
    ({"router": {"epp": {"podAnnotations": {"a": "b"}}}}, "does not annotate the EPP pods"),
    ({"router": {"clusterDomain": "corp.local"}}, "needs no cluster domain"),
    ({"router": {"monitoring": {"provider": {"name": "gmp"}}}}, "provider.name=gke"),
    ({"httpRoute": {"create": True, "headerMatches": [{"name": "x", "value": "y"}]}},
     "matches on the path"),
    ({"httpRoute": {"inferenceGatewayNamespace": "other"}}, "release namespace only"),
    ({"provider": {"gke": {"preferredBackends": {"enabled": True}}}},
     "preferred backends are not rendered"),
    ({"router": {"epp": {"replica": 2}}}, "replica"),  # a typo: the schema names the key
])
def test_what_cannot_be_honoured_is_refused_with_the_reason(
        tmp_path: Path, values: dict[str, Any], reason: str) -> None:
    assert reason in refusal("inferencepool", values=write(tmp_path, values))
