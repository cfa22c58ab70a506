"""``vllmgrpc-parser`` and ``vertexai-parser`` through a real Envoy: gRPC clients call
vLLM's engine API (or Vertex AI's ChatCompletions) on the gateway, the EPP reads the protobuf
request, picks a pod, and Envoy carries the call over h2c to a real gRPC server (grpcio)
standing in for the model server's gRPC entrypoint.

Two pods; their vLLM metrics come from small HTTP servers on a separate port
(``--model-server-metrics-port``) so the test decides which one the EPP prefers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import pytest
from google.api import httpbody_pb2

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from devkit.topology import Pool, Topology
from tests.epp.unit.test_grpc_parsers import GENERATE, generate_text, vertex_chat
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer
from tests.support.protowire import lfield, packed, varint, vfield

pytestmark = pytest.mark.envoy

HOSTS = ("127.0.6.1", "127.0.6.2")
QUEUES = (0, 9)  # the EPP prefers the first pod
CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- {name: grpc, type: vllmgrpc-parser}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
parser: {pluginRef: grpc}
"""
#: GenerateResponse{chunk=1 {token_ids}} then GenerateResponse{complete=2 {output_ids,
#: finish_reason, prompt_tokens=3, completion_tokens=4, cached_tokens=5}}
CHUNK = lfield(1, packed(1, [101, 102]))
COMPLETE = lfield(2, packed(1, [101, 102, 103]) + lfield(2, b"stop") + vfield(3, 11)
                  + vfield(4, 3) + vfield(5, 0))


@dataclass
class GrpcPod:
    """A real gRPC server answering one server-streaming method with ``replies``; keeps the
    request messages it received."""

    name: str
    host: str
    port: int
    service: str = "vllm.grpc.engine.VllmEngine"
    method: str = "Generate"
    replies: tuple[bytes, ...] = (CHUNK, COMPLETE)
    received: list[bytes] = field(default_factory=list)
    server: Any = None

    def start(self) -> GrpcPod:
        def handle(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            self.received.append(request)
            context.send_initial_metadata((("x-inference-pod", self.name),))
            yield from self.replies

        handler = grpc.method_handlers_generic_handler(self.service, {
            self.method: grpc.unary_stream_rpc_method_handler(handle)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"{self.host}:{self.port}")
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=None)


@dataclass
class Gateway:
    listen: int
    epp: EppProcess
    pods: list[GrpcPod]

    def call(self, method: str, body: bytes) -> tuple[list[bytes], dict[str, str]]:
        """One server-streaming call on the gateway: the raw response messages and the
        initial metadata."""
        with grpc.insecure_channel(f"127.0.0.1:{self.listen}") as channel:
            call = channel.unary_stream(method)(body, timeout=10)
            messages = list(call)
            return messages, dict(call.initial_metadata())

    def generate(self, body: bytes) -> tuple[list[bytes], dict[str, str]]:
        return self.call(GENERATE, body)


def start_gateway(bg: BackgroundLoop, tmp_path: Path, config: str,
                  pod: Callable[[str, str, int], GrpcPod],
                  extra_manifests: Sequence[dict[str, Any]] = ()) -> Iterator[Gateway]:
    port, metrics_port = e.free_port(), e.free_port()
    metrics = []
    for i, host in enumerate(HOSTS):
        m = bg.run(FakeModelServer(f"metrics-{i}", host, metrics_port).start())
        m.waiting = QUEUES[i]
        metrics.append(m)
    pods = [pod(f"pod-{i}", h, port).start() for i, h in enumerate(HOSTS)]
    manifests = tmp_path / "pool.yaml"
    write_yaml(manifests, [*pool_manifests(
        "pool", [(f"pod-{i}", h) for i, h in enumerate(HOSTS)], port), *extra_manifests])
    epp = EppProcess(manifests, "--config-text", config, "--model-server-metrics-port",
                     str(metrics_port), log_path=tmp_path / "epp.log").wait_serving()
    admin, listen = e.free_port(), e.free_port()
    bootstrap = Topology(listen=listen, admin=admin, pools=[Pool(
        "pool", epp_port=epp.port, endpoints=[(h, port) for h in HOSTS], h2c=True)]).bootstrap()
    envoy = e.Envoy(bootstrap, admin_port=admin, workdir=tmp_path / "envoy").start()
    g = Gateway(listen, epp, pods)
    wait_ranked(g)
    yield g
    envoy.stop()
    epp.stop()
    for p in pods:
        p.stop()
    for m in metrics:
        bg.run(m.stop())


@pytest.fixture
def gateway(bg: BackgroundLoop, tmp_path: Path) -> Iterator[Gateway]:
    yield from start_gateway(bg, tmp_path, CONFIG, GrpcPod)


def wait_ranked(g: Gateway) -> None:
    """Until the EPP has scraped both pods (its first picks would otherwise be unranked)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pool = httpx.get(f"http://127.0.0.1:{g.epp.metrics}/debug/pool", timeout=5).json()
        if sorted(ep["waiting"] for ep in pool["endpoints"] if ep["healthy"]) == list(QUEUES):
            return
        time.sleep(0.05)
    raise AssertionError(f"EPP never scraped both pods: {pool}")


def input_tokens_sum(g: Gateway) -> float:
    text = httpx.get(f"http://127.0.0.1:{g.epp.metrics}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("inference_objective_input_tokens_sum"))


def test_generate_is_routed_by_the_epp_and_reaches_the_pod_unchanged(gateway: Gateway) -> None:
    body = generate_text("hello over grpc", stream=True)
    for _ in range(3):
        messages, metadata = gateway.generate(body[5:])
        assert messages == [CHUNK, COMPLETE]  # streamed back byte for byte
        assert metadata["x-inference-pod"] == "pod-0"  # the EPP's pick (shortest queue)
    assert gateway.pods[0].received == [body[5:]] * 3
    assert gateway.pods[1].received == []


def test_usage_of_the_grpc_response_is_recorded(gateway: Gateway) -> None:
    gateway.generate(generate_text("count my tokens")[5:])
    deadline = time.monotonic() + 5
    while input_tokens_sum(gateway) != 11 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert input_tokens_sum(gateway) == 11  # prompt_tokens of the Complete message


def test_malformed_generate_is_refused_before_any_pod(gateway: Gateway) -> None:
    """A GenerateRequest with neither text nor tokens: the EPP answers 400 with the
    OpenAI-style JSON error and no pod sees the call. Envoy turns a local reply to a gRPC
    request into a gRPC status (HTTP 400 → INTERNAL) whose message is that JSON."""
    with pytest.raises(grpc.RpcError) as err:
        gateway.generate(lfield(1, b"no-input"))
    assert err.value.code() == grpc.StatusCode.INTERNAL
    error = orjson.loads(err.value.details() or "{}")["error"]
    assert error["message"] == "vLLM GenerateRequest has neither 'text' nor 'tokenized' input"
    assert error["type"] == "invalid_request_error"
    assert gateway.pods[0].received == [] and gateway.pods[1].received == []


def test_malformed_frame_from_a_plain_http_client_is_400(gateway: Gateway) -> None:
    r = httpx.post(f"http://127.0.0.1:{gateway.listen}{GENERATE}", content=b"\x00\x00",
                   timeout=5, headers={"content-type": "application/octet-stream"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_grpc_frame"
    assert gateway.pods[0].received == [] and gateway.pods[1].received == []


# -- vertexai-parser: a model rewrite re-encodes the protobuf message --------------------------

VERTEX_SERVICE = "google.cloud.aiplatform.v1beta1.PredictionService"
VERTEX_CONFIG = CONFIG.replace("vllmgrpc-parser", "vertexai-parser")
REWRITE = {"apiVersion": "inference.networking.x-k8s.io/v1alpha2",
           "kind": "InferenceModelRewrite", "metadata": {"name": "to-v2"},
           "spec": {"poolRef": {"name": "pool"}, "rules": [{
               "matches": [{"model": {"type": "Exact", "value": "chat"}}],
               "targets": [{"modelRewrite": "chat-v2"}]}]}}
SSE_REPLY = httpbody_pb2.HttpBody(
    content_type="text/event-stream",
    data=b'data: {"model":"chat-v2","choices":[]}\n\n').SerializeToString()


def vertex_pod(name: str, host: str, port: int) -> GrpcPod:
    return GrpcPod(name, host, port, service=VERTEX_SERVICE, method="ChatCompletions",
                   replies=(SSE_REPLY,))


@pytest.fixture
def vertex_gateway(bg: BackgroundLoop, tmp_path: Path) -> Iterator[Gateway]:
    yield from start_gateway(bg, tmp_path, VERTEX_CONFIG, vertex_pod, [REWRITE])


def test_vertex_chat_is_rewritten_inside_its_protobuf_and_reaches_the_pod(
        vertex_gateway: Gateway) -> None:
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body = vertex_chat(chat)[5:]
    messages, metadata = vertex_gateway.call(f"/{VERTEX_SERVICE}/ChatCompletions", body)
    assert messages == [SSE_REPLY] and metadata["x-inference-pod"] == "pod-0"
    (received,) = vertex_gateway.pods[0].received
    # ChatCompletionsRequest{endpoint = 1, http_body = 2}, read back by hand
    endpoint = lfield(1, b"projects/p/endpoints/e")
    assert received.startswith(endpoint)
    inner = received[len(endpoint):]
    assert inner[0] == 0x12
    http_body = httpbody_pb2.HttpBody.FromString(inner[1 + len(varint(len(inner) - 2)):])
    assert orjson.loads(http_body.data) == {**chat, "model": "chat-v2"}
    assert http_body.extensions[0].type_url == "type.googleapis.com/x.Extra"


def test_vertex_chat_without_messages_is_refused_before_any_pod(
        vertex_gateway: Gateway) -> None:
    with pytest.raises(grpc.RpcError) as err:
        vertex_gateway.call(f"/{VERTEX_SERVICE}/ChatCompletions",
                            vertex_chat({"model": "chat"})[5:])
    assert orjson.loads(err.value.details() or "{}")["error"]["message"] == (
        "'messages' is required for chat requests")
    assert vertex_gateway.pods[0].received == [] and vertex_gateway.pods[1].received == []
