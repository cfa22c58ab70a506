"""llm-d v0.10's EPP flags on the real ``epp`` process, spoken to by a real gRPC ext_proc
client: ``--emit-endpoint-scores``, ``--grpc-max-recv-msg-size`` (and gzip-compressed
messages, which upstream's server accepts), ``--drain-timeout``, and
``--allow-experimental-plugins``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devkit.manifests import pool_manifests, write_yaml
from shared.flags import byte_size
from tests.support.inprocess import body_msgs, headers_msg
from tests.support.picker import start_servers
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer

BODY = orjson.dumps({"model": "m", "prompt": "hello"})


@pytest.fixture(scope="module")
def servers(bg: BackgroundLoop) -> Iterator[list[FakeModelServer]]:
    """Three real model servers (their scrapes keep the endpoints ready)."""
    s = start_servers(bg, 3)
    yield s
    for server in s:
        bg.run(server.stop())


@pytest.fixture
def manifests(tmp_path: Path, servers: list[FakeModelServer]) -> Path:
    path = tmp_path / "pool.yaml"
    write_yaml(path, pool_manifests("pool", [(s.name, s.host) for s in servers],
                                    servers[0].port))
    return path


def exchange(port: int, body: bytes = BODY, *,
             compression: grpc.Compression = grpc.Compression.NoCompression,
             ) -> list[pb.ProcessingResponse]:
    """One request's ext_proc messages (headers, body) and the EPP's answers to them."""
    msgs = [headers_msg([(":method", "POST"), (":path", "/v1/completions"),
                         ("content-type", "application/json")]),
            *body_msgs(body, [])]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[
            ("grpc.max_send_message_length", 64 << 20)]) as ch:
        stub = pb_grpc.ExternalProcessorStub(ch)
        out = []
        for resp in stub.Process(iter(msgs), timeout=10, compression=compression):
            out.append(resp)
            if resp.HasField("request_body") or resp.HasField("immediate_response"):
                break
        return out


def lb_metadata(responses: list[pb.ProcessingResponse]) -> dict:
    for r in responses:
        if r.HasField("dynamic_metadata"):
            return MessageToDict(r.dynamic_metadata).get("envoy.lb", {})
    raise AssertionError(f"no dynamic metadata in {responses}")


@pytest.fixture
def epp_with_scores(manifests: Path) -> Iterator[EppProcess]:
    epp = EppProcess(manifests, "--emit-endpoint-scores").wait_serving()
    yield epp
    epp.stop()


def test_emit_endpoint_scores_sends_every_scored_endpoint(
        epp_with_scores: EppProcess, servers: list[FakeModelServer]) -> None:
    keys = {s.key for s in servers}
    lb = lb_metadata(exchange(epp_with_scores.port))
    scores = lb["x-gateway-destination-endpoint-scores"]
    assert set(scores) == keys
    assert all(isinstance(v, float) for v in scores.values())
    assert lb["x-gateway-destination-endpoint"] in keys


def test_without_the_flag_no_scores_are_sent(manifests: Path,
                                             servers: list[FakeModelServer]) -> None:
    epp = EppProcess(manifests).wait_serving()
    try:
        lb = lb_metadata(exchange(epp.port))
        assert "x-gateway-destination-endpoint-scores" not in lb
        assert lb["x-gateway-destination-endpoint"] in {s.key for s in servers}
    finally:
        epp.stop()


def test_grpc_max_recv_msg_size_bounds_a_message_and_gzip_is_accepted(manifests: Path) -> None:
    epp = EppProcess(manifests, "--grpc-max-recv-msg-size", "64KiB").wait_serving()
    try:
        big = orjson.dumps({"model": "m", "prompt": "x" * 100_000})
        with pytest.raises(grpc.RpcError) as e:
            exchange(epp.port, big)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Compressed on the wire, the same request still arrives whole.
        assert lb_metadata(exchange(epp.port, BODY, compression=grpc.Compression.Gzip))
        assert lb_metadata(exchange(epp.port))
    finally:
        epp.stop()


def test_byte_sizes_are_read_as_upstream_reads_them() -> None:
    assert byte_size("10MiB") == 10 << 20
    assert byte_size("25MB") == 25_000_000
    assert byte_size("4194304") == 4194304
    with pytest.raises(Exception, match="invalid size"):
        byte_size("lots")


def health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=1).status


def test_drain_timeout_keeps_serving_new_streams_while_not_ready(
        manifests: Path, servers: list[FakeModelServer]) -> None:
    epp = EppProcess(manifests, "--drain-timeout", "3s").wait_serving()
    try:
        epp.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 2
        while health(epp.health) == health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, "still SERVING after SIGTERM"
            time.sleep(0.05)
        # NOT_SERVING, yet a request that still arrives is routed, not refused.
        picked = lb_metadata(exchange(epp.port))["x-gateway-destination-endpoint"]
        assert picked in {s.key for s in servers}
        assert epp.proc.poll() is None
        epp.proc.wait(10)
        assert epp.proc.returncode == 0
    finally:
        epp.stop()


def test_without_drain_timeout_new_streams_are_refused_after_sigterm(manifests: Path) -> None:
    epp = EppProcess(manifests).wait_serving()
    try:
        epp.proc.send_signal(signal.SIGTERM)
        epp.proc.wait(10)
        with pytest.raises(grpc.RpcError):
            exchange(epp.port)
    finally:
        epp.stop()


ALPHA_CONFIG = """\
plugins:
- type: session-affinity-scorer
schedulingProfiles:
- name: default
  plugins: [{pluginRef: session-affinity-scorer}]
"""


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epp.main", "--check-config",
                           "--config-text", ALPHA_CONFIG, *args],
                          capture_output=True, text=True, timeout=60)


def test_an_alpha_plugin_needs_allow_experimental_plugins() -> None:
    refused = check()
    assert refused.returncode == 1
    line = refused.stderr.strip().splitlines()[-1]
    assert "session-affinity-scorer" in line and "--allow-experimental-plugins" in line
    assert "--config-text" in line
    allowed = check("--allow-experimental-plugins")
    assert allowed.returncode == 0, allowed.stderr


def test_v010_flags_parse_with_upstreams_value_syntax() -> None:
    from epp.main import parser

    args = parser().parse_args([
        "--drain-timeout=30s", "--emit-endpoint-scores=true", "--grpc-max-recv-msg-size=10MiB",
        "--grpc-max-send-msg-size=25MB", "--allow-experimental-plugins=false"])
    assert (args.drain_timeout, args.emit_endpoint_scores, args.grpc_max_recv_msg_size,
            args.grpc_max_send_msg_size, args.allow_experimental_plugins) == (
        30.0, True, 10 << 20, 25_000_000, False)
