"""The inferencepool chart's prefill/decode section (``disaggregation``, ours; docs/pd.md).

Rendered with the real helm and validated like every other render; what it says is held
against the code: the EPP config is built by the EPP's own loader from the rendered file and
args and routes the rendered pods by their labels; the sidecar's args parse with the real
``pd-sidecar`` parser; the vLLM args with the simulator's (vLLM's flag names); and the rendered
sidecar container runs as a real ``pd-sidecar`` process against the fake API server.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit import envoy as e
from epp.config import build, parse_config
from epp.main import settings
from epp.testing import endpoint, request
from modelserver.pd import PREFILLER_HEADER, ROLE_LABEL, can_decode, can_prefill
from tests.charts.kubelet import run_probe
from tests.charts.pod import LocalPod
from tests.charts.render import CHARTS, container, helm, one, refusal, render, template
from tests.charts.test_charts import rbac_rules, validate_rendered
from tests.charts.test_values import IP_VALUES, UPSTREAM, parse
from tests.epp.unit.test_epp_pd import route
from tests.support import k8s_objects as objects
from tests.support.fake_apiserver import FakeApiServer, selector_matches

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: The P/D section on, with the model servers; the least a user must give.
PD = ("disaggregation.enabled=true", "disaggregation.modelServers.enabled=true",
      f"disaggregation.modelServers.model={MODEL}",
      "disaggregation.modelServers.image.tag=v0.11.0")
#: Every key of the section set to something else than its default, with the section off.
PD_OFF_BUT_SET = ("disaggregation.nonCachedTokens=7", "disaggregation.modelServers.model=x",
                  "disaggregation.modelServers.image.tag=1",
                  "disaggregation.modelServers.decode.replicas=3",
                  "disaggregation.modelServers.decode.vllmPort=9000",
                  "disaggregation.modelServers.prefill.replicas=5",
                  "disaggregation.modelServers.sidecar.kvConnector=shared-storage")


def decode_pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objs, "Deployment", "pool-a-decode")["spec"]["template"]


def prefill_pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objs, "Deployment", "pool-a-prefill")["spec"]["template"]


def sidecar_args(c: dict[str, Any]) -> Any:
    """Parse with the real ``pd-sidecar`` parser; a refusal fails with its message."""
    from sidecar.main import parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser().parse_args(c["args"])
    except SystemExit:
        raise AssertionError(f"pd-sidecar refuses its rendered args: {err.getvalue()}") from None


def vllm_args(c: dict[str, Any]) -> Any:
    """Parse with the simulator's parser, which takes vLLM's flag names and JSON."""
    from sim.main import build_parser

    return build_parser().parse_args(c["args"])


# -- off: nothing changes ---------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, IP_VALUES], ids=["ours", "upstream-v1.5.0"])
def test_the_section_off_renders_exactly_what_the_chart_did(values: Path | None) -> None:
    """Off (the default), its keys change nothing: byte for byte the same render."""
    files = [values] if values else None
    plain = template("inferencepool", values=files)
    assert plain.returncode == 0, plain.stderr
    set_but_off = template("inferencepool", *PD_OFF_BUT_SET, values=files)
    assert set_but_off.returncode == 0, set_but_off.stderr
    assert set_but_off.stdout == plain.stdout
    objs = [d for d in yaml.safe_load_all(plain.stdout) if d]
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"] == ["pool-a-epp"]
    assert set(one(objs, "ConfigMap")["data"]) == {"default-plugins.yaml"}
    assert ROLE_LABEL not in plain.stdout
    assert parse("epp", container(objs, "epp")["args"]).config_file == (
        "/config/default-plugins.yaml")


# -- the EPP config ---------------------------------------------------------------------------


def pd_runtime(objs: list[dict[str, Any]]) -> Any:
    """The EPP built as the pod would build it: the file its rendered --config-file names,
    read from the rendered ConfigMap, with the settings of its rendered args."""
    args = parse("epp", container(objs, "epp", deployment="pool-a-epp")["args"])
    name = Path(args.config_file).name
    text = one(objs, "ConfigMap", "pool-a-epp")["data"][name]
    return build(parse_config(text, source=name), settings=settings(args))


def test_epp_loads_the_pd_config_and_routes_the_rendered_pods() -> None:
    objs = render("inferencepool", *PD)
    validate_rendered(objs)
    rt = pd_runtime(objs)
    assert set(rt.scheduler.profiles) == {"prefill", "decode"}
    # Endpoints labelled as the rendered pods are: 10.0.0.1-2 decode, 10.0.0.3-4 prefill.
    d, p = decode_pod(objs)["metadata"]["labels"], prefill_pod(objs)["metadata"]["labels"]
    pool = [endpoint(1, labels=d), endpoint(2, labels=d, waiting=3),
            endpoint(3, labels=p), endpoint(4, labels=p)]
    long = route(rt, request("x" * 20_000), pool)  # 5,000 uncached tokens ≥ 1024
    assert long.decode == "10.0.0.1:8000"
    assert long.prefiller in ("10.0.0.3:8000", "10.0.0.4:8000")
    short = route(rt, request("y" * 400), pool)  # 100 tokens
    assert short.decode == "10.0.0.1:8000" and short.prefiller is None


def test_pd_config_is_llm_ds_plugin_set_with_the_measured_prefill_scorer() -> None:
    objs = render("inferencepool", "disaggregation.enabled=true",
                  "disaggregation.nonCachedTokens=4096")
    doc = yaml.safe_load(one(objs, "ConfigMap")["data"]["pd-plugins.yaml"])
    types = {p["type"]: p.get("parameters") for p in doc["plugins"]}
    assert types["prefix-based-pd-decider"] == {"nonCachedTokens": 4096}
    assert types["disagg-profile-handler"] == {"deciders": {"prefill": "prefix-based-pd-decider"}}
    assert {"prefill-filter", "decode-filter", "prefix-cache-scorer", "token-load-scorer",
            "queue-scorer", "max-score-picker"} <= set(types)
    profiles = {p["name"]: {r["pluginRef"]: r.get("weight") for r in p["plugins"]}
                for p in doc["schedulingProfiles"]}
    assert profiles["prefill"] == {"prefill-filter": None, "max-score-picker": None,
                                   "prefix-cache-scorer": 2, "token-load-scorer": 1}
    assert profiles["decode"] == {"decode-filter": None, "max-score-picker": None,
                                  "prefix-cache-scorer": 2, "queue-scorer": 1}
    # The threshold from values is the one the loaded decider applies.
    rt = pd_runtime(objs)
    d = [endpoint(1, labels={ROLE_LABEL: "decode"}), endpoint(2, labels={ROLE_LABEL: "prefill"})]
    assert route(rt, request("x" * 4 * 4000), d).prefiller is None  # 4,000 < 4,096
    assert route(rt, request("z" * 4 * 4200), d).prefiller == "10.0.0.2:8000"


def test_pd_config_without_model_servers_adds_only_the_config() -> None:
    """Pods deployed by other means (llm-d's manifests, your own) need only the config."""
    objs = render("inferencepool", "disaggregation.enabled=true")
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"] == ["pool-a-epp"]
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Role"] == ["pool-a-epp"]
    assert parse("epp", container(objs, "epp")["args"]).config_file == "/config/pd-plugins.yaml"


def test_a_config_file_the_user_named_wins_over_the_pd_config() -> None:
    objs = render("inferencepool", "disaggregation.enabled=true",
                  "inferenceExtension.pluginsConfigFile=mine.yaml",
                  "inferenceExtension.pluginsCustomConfig.mine\\.yaml=plugins: []")
    assert parse("epp", container(objs, "epp")["args"]).config_file == "/config/mine.yaml"
    assert {"pd-plugins.yaml", "mine.yaml"} <= set(one(objs, "ConfigMap")["data"])


def test_pd_config_scrapes_and_parses_as_the_default_config() -> None:
    objs = render("inferencepool", "disaggregation.enabled=true",
                  "inferenceExtension.metricsDataSource.path=/stats",
                  "inferencePool.parser=passthrough-parser")
    data = one(objs, "ConfigMap")["data"]
    default, pd = (yaml.safe_load(data[f]) for f in ("default-plugins.yaml", "pd-plugins.yaml"))
    data_layer = ("metrics-data-source", "core-metrics-extractor", "passthrough-parser")
    assert [p for p in pd["plugins"] if p["type"] in data_layer] == [
        p for p in default["plugins"] if p["type"] in data_layer]
    assert pd["parser"] == default["parser"] == {"pluginRef": "passthrough-parser"}
    assert pd_runtime(objs).parser.type_name == "passthrough-parser"


# -- the model servers ------------------------------------------------------------------------


def test_pods_carry_the_pool_selector_and_their_role() -> None:
    objs = render("inferencepool", *PD, "inferencePool.modelServers.matchLabels.app=llama",
                  "disaggregation.modelServers.prefill.replicas=3",
                  "disaggregation.modelServers.decode.replicas=2")
    selector = one(objs, "InferencePool")["spec"]["selector"]["matchLabels"]
    for name, role, replicas in (("pool-a-prefill", "prefill", 3), ("pool-a-decode", "decode", 2)):
        dep = one(objs, "Deployment", name)
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert labels == {"app": "llama", ROLE_LABEL: role}
        assert dep["spec"]["selector"]["matchLabels"] == labels
        assert dep["spec"]["replicas"] == replicas
        assert selector_matches(",".join(f"{k}={v}" for k, v in selector.items()), labels)
    assert can_prefill(prefill_pod(objs)["metadata"]["labels"])
    assert not can_prefill(decode_pod(objs)["metadata"]["labels"])
    assert can_decode(decode_pod(objs)["metadata"]["labels"])


def test_decode_pods_run_the_sidecar_on_the_target_port_in_front_of_vllm() -> None:
    objs = render("inferencepool", *PD, "inferencePool.targetPorts[0].number=8100",
                  "disaggregation.modelServers.decode.vllmPort=8300")
    validate_rendered(objs)
    pod = decode_pod(objs)["spec"]
    (side,) = pod["initContainers"]
    assert side["name"] == "pd-sidecar" and side["restartPolicy"] == "Always"  # native sidecar
    assert side["command"] == ["pd-sidecar"]
    assert side["image"] == "ghcr.io/inference-gateway-py/pd-sidecar:0.1.0"
    args = sidecar_args(side)
    assert (args.port, args.vllm_port) == (8100, 8300)
    assert args.kv_connector == "nixlv2" and args.enable_ssrf_protection is True
    assert args.pool_group == "inference.networking.k8s.io"
    assert args.prefill_timeout == 60.0 and args.metrics_port == 9090
    assert side["env"] == [{"name": "INFERENCE_POOL", "value": "llm/pool-a"}]
    assert {p["name"]: p["containerPort"] for p in side["ports"]} == {
        "http": 8100, "sidecar-metrics": 9090}
    assert side["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    (vllm,) = pod["containers"]
    v = vllm_args(vllm)
    assert v.model == MODEL and v.port == [8300]
    assert json.loads(v.kv_transfer_config) == {"kv_connector": "NixlConnector",
                                                "kv_role": "kv_both"}
    assert [p["containerPort"] for p in vllm["ports"]] == [8300]
    assert vllm["readinessProbe"]["httpGet"]["port"] == 8300
    env = {x["name"]: x for x in vllm["env"]}
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "status.podIP"}}
    assert pod["serviceAccountName"] == "pool-a-pd-sidecar"


def test_prefill_pods_serve_vllm_on_the_target_port_without_api_access() -> None:
    objs = render("inferencepool", *PD, "inferencePool.targetPorts[0].number=8100",
                  "disaggregation.modelServers.args[0]=--max-model-len=16384",
                  "disaggregation.modelServers.prefill.args[0]=--enable-chunked-prefill",
                  "disaggregation.modelServers.prefill.resources.limits.nvidia\\.com/gpu=1")
    pod = prefill_pod(objs)["spec"]
    assert "initContainers" not in pod
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    (vllm,) = pod["containers"]
    v = vllm_args(vllm)
    assert v.port == [8100] and v.max_model_len == 16384 and v.enable_chunked_prefill is True
    assert vllm["args"][-2:] == ["--max-model-len=16384", "--enable-chunked-prefill"]
    assert vllm["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert vllm["image"] == "docker.io/vllm/vllm-openai:v0.11.0"


def test_sidecar_values_reach_its_flags() -> None:
    objs = render("inferencepool", *PD,
                  "disaggregation.modelServers.sidecar.kvConnector=shared-storage",
                  "disaggregation.modelServers.sidecar.enableSsrfProtection=false",
                  "disaggregation.modelServers.sidecar.prefillTimeout=1m30s",
                  "disaggregation.modelServers.sidecar.metricsPort=0",
                  "disaggregation.modelServers.sidecar.args[0]=--enable-prefiller-sampling",
                  "inferencePool.apiVersion=inference.networking.x-k8s.io/v1alpha2")
    side = container(objs, "pd-sidecar", deployment="pool-a-decode")
    args = sidecar_args(side)
    assert args.kv_connector == "shared-storage" and args.enable_ssrf_protection is False
    assert args.prefill_timeout == 90.0 and args.metrics_port == 0
    assert args.enable_prefiller_sampling is True
    assert args.pool_group == "inference.networking.x-k8s.io"
    assert [p["name"] for p in side["ports"]] == ["http"]
    assert "inference.networking.x-k8s.io/inferencepools" in rbac_rules_of(objs)


def rbac_rules_of(objs: list[dict[str, Any]]) -> dict[str, set[str]]:
    return rbac_rules([o for o in objs if o["metadata"]["name"] == "pool-a-pd-sidecar"])


def test_sidecar_rbac_is_read_only_on_what_its_source_lists() -> None:
    objs = render("inferencepool", *PD)
    read = {"get", "list", "watch"}
    assert rbac_rules_of(objs) == {
        "/pods": read,
        "inference.networking.k8s.io/inferencepools": read,
        "llm-d.ai/inferenceobjectives": read,
        "llm-d.ai/inferencemodelrewrites": read,
        "inference.networking.x-k8s.io/inferenceobjectives": read,
        "inference.networking.x-k8s.io/inferencemodelrewrites": read,
        "inference.networking.x-k8s.io/inferencemodels": read,
    }
    binding = one(objs, "RoleBinding", "pool-a-pd-sidecar")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "pool-a-pd-sidecar"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pool-a-pd-sidecar",
                                    "namespace": "llm"}]
    assert one(objs, "ServiceAccount", "pool-a-pd-sidecar")
    # The EPP's own role is unchanged.
    assert rbac_rules([o for o in objs if o["metadata"]["name"] == "pool-a-epp"]) == (
        rbac_rules(render("inferencepool")))


def test_sidecar_container_is_hardened_like_the_epps() -> None:
    side = container(render("inferencepool", *PD), "pd-sidecar", deployment="pool-a-decode")
    sc = side["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert side["resources"]["requests"]["cpu"] and side["resources"]["requests"]["memory"]


@pytest.mark.parametrize("provider", ["none", "istio", "gke"])
def test_pd_render_validates_and_lints(provider: str, tmp_path: Path) -> None:
    objs = render("inferencepool", *PD, f"provider.name={provider}")
    validate_rendered(objs)
    values = tmp_path / "pd.yaml"
    values.write_text(yaml.safe_dump({"disaggregation": {
        "enabled": True, "modelServers": {"enabled": True, "model": MODEL,
                                          "image": {"tag": "v0.11.0"}}}}))
    proc = subprocess.run([helm(), "lint", "--strict", str(CHARTS / "inferencepool"),
                           "--values", str(values), "--set", f"provider.name={provider}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_upstream_values_with_pd_on_still_render() -> None:
    objs = render("inferencepool", *PD,
                  values=[IP_VALUES, UPSTREAM / "latency-predictor-defaults.yaml"])
    validate_rendered(objs)
    assert parse("epp", container(objs, "epp", deployment="pool-a-epp")["args"]).config_file == (
        "/config/pd-plugins.yaml")


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "message"), [
    ("disaggregation.colour=blue", "'colour' not allowed"),
    ("disaggregation.modelServers.gpus=1", "'gpus' not allowed"),
    ("disaggregation.modelServers.decode.vllmport=1", "'vllmport' not allowed"),
    ("disaggregation.modelServers.sidecar.tls=true", "'tls' not allowed"),
    ("disaggregation.modelServers.sidecar.kvConnector=sglang", "kvConnector"),
    ("disaggregation.nonCachedTokens=-1", "nonCachedTokens"),
])
def test_schema_refuses_what_the_section_does_not_know(setting: str, message: str) -> None:
    err = refusal("inferencepool", setting)
    assert "schema" in err and message in err, err


@pytest.mark.parametrize(("sets", "message"), [
    (("disaggregation.modelServers.enabled=true",),
     "disaggregation.modelServers.enabled needs disaggregation.enabled=true"),
    (("disaggregation.enabled=true", "inferencePool.modelServerType=sglang"),
     "disaggregation needs inferencePool.modelServerType=vllm, got sglang"),
    (("disaggregation.enabled=true", "inferencePool.modelServerProtocol=grpc"),
     "disaggregation needs inferencePool.modelServerProtocol=http"),
    (("disaggregation.enabled=true", "inferencePool.modelServers.matchLabels.llm-d\\.ai/role=x"),
     "inferencePool.modelServers.matchLabels must not hold llm-d.ai/role"),
    ((*PD, "inferencePool.targetPorts[0].number=8000",
      "inferencePool.targetPorts[1].number=8001"),
     "needs exactly one inferencePool.targetPorts entry, got 2"),
    ((*PD, "disaggregation.modelServers.model="),
     "disaggregation.modelServers.model is required"),
    ((*PD, "disaggregation.modelServers.image.tag="),
     "disaggregation.modelServers.image.tag is required"),
    ((*PD, "disaggregation.modelServers.decode.replicas=0"),
     "disaggregation.modelServers.decode.replicas must be at least 1, got 0"),
    ((*PD, "disaggregation.modelServers.prefill.replicas=-1"),
     "disaggregation.modelServers.prefill.replicas must be 0 or more, got -1"),
    ((*PD, "disaggregation.modelServers.decode.vllmPort=8000"),
     "decode.vllmPort must differ from the pool's target port 8000"),
    ((*PD, "disaggregation.modelServers.sidecar.metricsPort=8200"),
     "sidecar.metricsPort 8200 is taken"),
], ids=["needs-enabled", "engine", "grpc", "role-selector", "ports", "model", "tag",
        "decode-replicas", "prefill-replicas", "vllm-port", "metrics-port"])
def test_bad_pd_values_are_refused_with_one_clear_message(sets: tuple[str, ...],
                                                          message: str) -> None:
    err = refusal("inferencepool", *sets)
    assert message in err, err


def test_prefill_replicas_zero_is_a_decode_only_pool() -> None:
    objs = render("inferencepool", *PD, "disaggregation.modelServers.prefill.replicas=0")
    assert one(objs, "Deployment", "pool-a-prefill")["spec"]["replicas"] == 0


# -- the rendered sidecar, running ------------------------------------------------------------


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer(bookmark_interval=0.1).start()
    yield server
    server.close()


def metric(port: int, name: str, **labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def complete(port: int, prefiller: str) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                      headers={PREFILLER_HEADER: prefiller},
                      json={"model": MODEL, "prompt": "hello " * 50, "max_tokens": 3})


def eventually(check: Any, what: str, attempts: int = 100) -> None:
    for _ in range(attempts):
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


def test_rendered_sidecar_prefills_only_on_the_pools_prefill_pods(apiserver: FakeApiServer,
                                                                   tmp_path: Path) -> None:
    """The decode pod's sidecar container, started as kubelet would (rendered command, args,
    env; ``KUBECONFIG`` to the fake API server), reads the pool named by ``INFERENCE_POOL``
    and its pods, and honours ``x-prefiller-host-port`` only for a ready prefill pod of it.

    The vLLM container cannot run here; the simulator takes its place with the vLLM
    container's rendered args (vLLM's flag names and ``--kv-transfer-config`` JSON). On one
    host the prefill pod's address ``127.0.0.2:<targetPort>`` is the sidecar's own listener
    (it binds 0.0.0.0), so an honoured prefill leg reaches the sidecar itself, which passes it
    to the simulator without the ``kv_transfer_params`` it strips from every inbound body:
    the leg answers without KV parameters and the request is decoded locally, counted as a
    ``bad_response`` fallback. That count, against ``prefiller_rejected``, is what tells an
    honoured prefiller from a refused one.
    """
    port, vllm_port, metrics_port = e.free_port(), e.free_port(), e.free_port()
    objs = render("inferencepool", *PD, f"inferencePool.targetPorts[0].number={port}",
                  f"disaggregation.modelServers.decode.vllmPort={vllm_port}",
                  f"disaggregation.modelServers.sidecar.metricsPort={metrics_port}")
    vllm = container(objs, "vllm", deployment="pool-a-decode")
    sim = subprocess.Popen([str(Path(sys.executable).parent / "vllm-sim"), *vllm["args"]],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    side = container(objs, "pd-sidecar", deployment="pool-a-decode")
    pod = LocalPod(objs, side, apiserver=apiserver, workdir=tmp_path, pod_name="pool-a-decode-0",
                   deployment="pool-a-decode")
    try:
        eventually(lambda: run_probe(vllm["readinessProbe"], vllm)[0], "the simulator is up")
        pod.wait_probe("readinessProbe")
        pod.wait_probe("livenessProbe")
        prefill_labels = prefill_pod(objs)["metadata"]["labels"]
        decode_labels = decode_pod(objs)["metadata"]["labels"]
        apiserver.apply(one(objs, "InferencePool"))
        apiserver.apply(objects.pod("decode-0", "127.0.0.1", labels=decode_labels))
        apiserver.apply(objects.pod("other-0", "127.0.0.3", labels={ROLE_LABEL: "prefill"}))
        prefill = f"127.0.0.2:{port}"

        def rejected() -> float:
            return metric(metrics_port, "pd_sidecar_prefiller_rejected_total")

        def honoured() -> float:
            return metric(metrics_port, "pd_sidecar_prefill_fallbacks_total",
                          reason="bad_response")

        # Not (yet) a pod of the pool: refused, decoded locally, never an error.
        r = complete(port, prefill)
        assert r.status_code == 200, r.text
        assert (rejected(), honoured()) == (1, 0)
        # A ready prefill pod of the pool at that address: honoured once the watch has it.
        apiserver.apply(objects.pod("prefill-0", "127.0.0.2", labels=prefill_labels))
        eventually(lambda: complete(port, prefill).status_code == 200 and honoured() >= 1,
                   "the pool's prefill pod is honoured")
        # Outside the pool's selector, or the decode pod: refused.
        before = rejected()
        assert complete(port, f"127.0.0.3:{port}").status_code == 200
        assert complete(port, f"127.0.0.1:{port}").status_code == 200
        assert rejected() == before + 2
        # Relabelled to decode: refused again.
        apiserver.apply(objects.pod("prefill-0", "127.0.0.2", labels=decode_labels))
        seen = rejected()
        eventually(lambda: complete(port, prefill).status_code == 200 and rejected() > seen,
                   "the relabelled pod is refused")
    finally:
        code = pod.stop()
        sim.terminate()
        sim.wait(15)
        assert code == 0, pod.log_tail()


# -- the image --------------------------------------------------------------------------------


def test_dockerfile_builds_the_sidecar_image_the_chart_names() -> None:
    """The chart's default sidecar image is the Dockerfile's ``pd-sidecar`` target, and
    that image holds every package of this repository the sidecar imports."""
    from tests.support.helm import REPO

    dockerfile = (REPO / "Dockerfile").read_text()
    side = container(render("inferencepool", *PD), "pd-sidecar", deployment="pool-a-decode")
    target = side["image"].rsplit("/", 1)[1].split(":")[0]
    assert f"FROM runtime AS {target}\n" in dockerfile
    assert f'ENTRYPOINT ["{side["command"][0]}"]' in dockerfile
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")
              and "--from" not in line}
    probe = ("import sys; import sidecar.main, epp.sources.kubernetes; "
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, cwd="/").stdout.split()
    ours = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
    assert set(loaded) & ours <= copied, sorted(set(loaded) & ours - copied)
