"""One trace through the real Envoy: the client's ``traceparent`` continued by Envoy's own
OpenTelemetry tracer, BBR and the EPP, every span received on a real OTLP/gRPC endpoint."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from devkit.otlp import OtlpReceiver, ReceivedSpan
from devkit.topology import Pool, Topology
from shared.upstream_flags import SERVICE_NAMES
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer

pytestmark = pytest.mark.envoy
#: The services' default OTEL_SERVICE_NAME (upstream's).
BBR, EPP = SERVICE_NAMES["bbr"], SERVICE_NAMES["epp"]

MODEL = "llama"
#: Spans leave the services and Envoy within a fraction of a second, not the SDK's 5 s.
FAST_EXPORT = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "100"}
ENVOY_FLUSH = {"tracing.opentelemetry.flush_interval_ms": 100}


@dataclass
class TracedGateway:
    url: str
    receiver: OtlpReceiver
    servers: list[FakeModelServer]


def _wait_health(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bbr exited: {log.read_text()[-2000:]}")
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                if health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(), timeout=1
                ).status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"bbr not serving: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def gateway(bg: BackgroundLoop, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[TracedGateway]:
    tmp = tmp_path_factory.mktemp("tracing")
    port = e.free_port()
    servers = [bg.run(FakeModelServer(f"llama-{i}", f"127.0.40.{i + 1}", port).start())
               for i in range(2)]
    for s in servers:
        s.model = MODEL
    manifests = tmp / "pool.yaml"
    write_yaml(manifests, pool_manifests("llama", [(s.name, s.host) for s in servers], port))
    receiver = OtlpReceiver(path=tmp / "traces.jsonl").start()
    env = {**os.environ, **FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
           "PYTHONUNBUFFERED": "1"}
    old = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith("OTEL_")})
    try:
        epp = EppProcess(manifests, "--tracing=true", log_path=tmp / "epp.log")
    finally:
        os.environ.clear()
        os.environ.update(old)
    bbr_port, bbr_health = e.free_port(), e.free_port()
    bbr_log = tmp / "bbr.log"
    with bbr_log.open("wb") as out:
        bbr = subprocess.Popen(
            [sys.executable, "-m", "bbr.main", "--secure-serving=false", "--streaming",
             "--grpc-port", str(bbr_port), "--grpc-health-port", str(bbr_health),
             "--metrics-port", str(e.free_port()), "--grace-period", "1", "--tracing=true"],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    admin, listen = e.free_port(), e.free_port()
    envoy = None
    try:
        epp.wait_serving()
        _wait_health(bbr_health, bbr, bbr_log)
        cfg = Topology(listen=listen, admin=admin, bbr_port=bbr_port, otlp_port=receiver.port,
                       runtime=ENVOY_FLUSH,
                       pools=[Pool("llama", models=[MODEL], epp_port=epp.port,
                                   endpoints=[(s.host, s.port) for s in servers])]).bootstrap()
        envoy = e.Envoy(cfg, admin_port=admin, workdir=tmp / "envoy").start()
        yield TracedGateway(f"http://127.0.0.1:{listen}", receiver, servers)
    finally:
        if envoy is not None:
            envoy.stop()
        bbr.terminate()
        bbr.wait(10)
        epp.stop()
        receiver.stop()
        for s in servers:
            bg.run(s.stop())


def _ancestry(span: ReceivedSpan, spans: dict[str, ReceivedSpan]) -> list[str]:
    """Span ids from ``span``'s parent up to the first id not received (the client's)."""
    out = []
    parent = span.parent_span_id
    while parent:
        out.append(parent)
        if parent not in spans:
            break
        parent = spans[parent].parent_span_id
    return out


def _traced_request(gw: TracedGateway, stream: bool) -> tuple[str, str, list[ReceivedSpan]]:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    body = {"model": MODEL, "prompt": "Tell me about tracing " * 10, "max_tokens": 3,
            "stream": stream}
    r = httpx.post(f"{gw.url}/v1/completions", json=body, timeout=30,
                   headers={"traceparent": f"00-{trace_id}-{client_span}-01"})
    assert r.status_code == 200, r.text

    def complete(spans: list[ReceivedSpan]) -> bool:
        mine = [s for s in spans if s.trace_id == trace_id]
        roots = {(s.service, s.name) for s in mine}
        return {(BBR, "gateway.request"), (EPP, "gateway.request")} <= roots and any(
            s.service == "envoy-gateway" and s.kind == 2 for s in mine)  # SERVER: ingress

    gw.receiver.wait_for(complete)
    time.sleep(0.3)  # Envoy's upstream span may land in a later flush than its ingress one
    return trace_id, client_span, gw.receiver.trace(trace_id)


def test_one_trace_links_envoy_bbr_and_epp_under_the_clients_traceparent(
        gateway: TracedGateway) -> None:
    trace_id, client_span, spans = _traced_request(gateway, stream=False)
    assert spans and all(s.trace_id == trace_id for s in spans)
    by_id = {s.span_id: s for s in spans}
    services = {s.service for s in spans}
    assert {"envoy-gateway", BBR, EPP} <= services
    # Every span hangs, through received spans only, from the client's span.
    for s in spans:
        assert _ancestry(s, by_id)[-1] == client_span, (s.service, s.name)
    ingress = [s for s in spans
               if s.service == "envoy-gateway" and s.parent_span_id == client_span]
    assert ingress, "Envoy's own span is not a child of the client's"
    bbr = next(s for s in spans if s.service == BBR and s.name == "gateway.request")
    epp = next(s for s in spans if s.service == EPP and s.name == "gateway.request")
    for root in (bbr, epp):
        assert ingress[0].span_id in _ancestry(root, by_id)  # under Envoy's request span
    assert bbr.attributes["gen_ai.request.model"] == MODEL
    bbr_children = {s.name for s in spans if s.parent_span_id == bbr.span_id}
    assert {"parse", "bbr.plugin.body-field-to-header"} <= bbr_children
    # Envoy's router span: the call to the model server the EPP picked.
    assert any(s.service == "envoy-gateway" and s.kind == 3 for s in spans)  # CLIENT


def test_epp_spans_cover_the_request_and_each_scorer_carries_its_scores(
        gateway: TracedGateway) -> None:
    _, _, spans = _traced_request(gateway, stream=True)
    epp = {s.span_id: s for s in spans if s.service == EPP}
    root = next(s for s in epp.values() if s.name == "gateway.request")
    names = [s.name for s in epp.values()]
    for name in ("parse", "run_scheduler_profile", "pre_request", "response"):
        assert name in names, names
    profile = next(s for s in epp.values() if s.name == "run_scheduler_profile")
    scorers = [s for s in epp.values() if s.name.startswith("llm_d.epp.scorer.")]
    assert len(scorers) >= 3, names  # the default profile: queue, kv-cache, prefix
    endpoints = sorted(f"{s.host}:{s.port}" for s in gateway.servers)
    for s in scorers:
        assert s.parent_span_id == profile.span_id
        assert s.attributes["llm_d.epp.scorer.type"] == s.name.removeprefix("llm_d.epp.scorer.")
        assert sorted(s.attributes["llm_d.epp.scorer.endpoints"]) == endpoints
        scores = s.attributes["llm_d.epp.scorer.scores"]
        assert len(scores) == 2 and all(0.0 <= x <= 1.0 for x in scores)
        assert s.attributes["llm_d.epp.scorer.score.max"] == max(scores)
        assert s.attributes["llm_d.epp.scorer.weight"] > 0
    picker = next(s for s in epp.values() if s.name.startswith("llm_d.epp.picker."))
    assert picker.attributes["llm_d.epp.picker.picked"][0] in endpoints
    # GenAI semantic conventions on the request's span: asked / served model, usage, TTFT.
    a = root.attributes
    assert a["gen_ai.request.model"] == MODEL and a["gen_ai.response.model"] == MODEL
    assert a["gen_ai.usage.input_tokens"] == 7 and a["gen_ai.usage.output_tokens"] == 3
    assert 0 < a["gen_ai.server.time_to_first_token"] < 10
    assert a["http.response.status_code"] == 200
