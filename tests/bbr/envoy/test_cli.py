"""The ``bbr`` command: flags, health, graceful drain (a real process behind a real Envoy)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devkit import envoy as e
from devkit.envoy import wait_for_port
from tests.support.processes import BackgroundLoop, EchoBackend

BBR = [sys.executable, "-m", "bbr.main"]


def run_bbr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BBR, *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--secure-serving=maybe"], "invalid boolean 'maybe'"),
        (["--grpc-port", "x"], "invalid int value"),
        (["--base-models", "/does/not/exist.yaml"], "cannot read base-models file"),
        (["--plugin", "no-such-plugin:x"], "unknown plugin type 'no-such-plugin'"),
        (["--plugin", "body-field-to-header"], "expected type:name[:json]"),
        (["--plugin", "body-field-to-header:x:{bad"], "parameters are not JSON"),
        (["--plugin", 'body-field-to-header:x:{"colour": 1}'], "unknown parameters"),
    ],
)
def test_bad_input_exits_nonzero_with_one_line(args: list[str], message: str) -> None:
    proc = run_bbr(*args)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("bbr: error:")
    assert message in lines[0]


def test_malformed_base_models_file_names_the_entry(tmp_path: Path) -> None:
    f = tmp_path / "bm.yaml"
    f.write_text("- adapters: [x]\n")
    proc = run_bbr("--base-models", str(f))
    assert proc.returncode != 0
    assert "entry 0: 'baseModel' must be a non-empty string" in proc.stderr


def test_help_lists_every_flag() -> None:
    out = run_bbr("--help").stdout
    for flag in ("--grpc-port", "--grpc-health-port", "--metrics-port", "--streaming",
                 "--secure-serving", "--cert-path", "--plugin", "--base-models", "-v"):
        assert flag in out


class BbrProcess:
    def __init__(self, tmp: Path, *extra: str) -> None:
        self.port, self.health, self.metrics = e.free_port(), e.free_port(), e.free_port()
        self.log = (tmp / "bbr.log").open("w")
        self.proc = subprocess.Popen(
            [*BBR, "--grpc-port", str(self.port), "--grpc-health-port", str(self.health),
             "--metrics-port", str(self.metrics), "--grace-period", "10", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        wait_for_port(self.health)

    def health_status(self) -> int:
        with grpc.insecure_channel(f"127.0.0.1:{self.health}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def bbr_streaming(tmp_path: Path) -> Iterator[BbrProcess]:
    p = BbrProcess(tmp_path, "--streaming", "--secure-serving=false")
    yield p
    p.stop()


def test_health_says_serving(bbr_streaming: BbrProcess) -> None:
    assert bbr_streaming.health_status() == health_pb2.HealthCheckResponse.SERVING


def test_metrics_port_serves_upstream_names(bbr_streaming: BbrProcess) -> None:
    wait_for_port(bbr_streaming.metrics)
    text = httpx.get(f"http://127.0.0.1:{bbr_streaming.metrics}/metrics").text
    assert "bbr_info{" in text
    assert "bbr_success_total" in text


def test_sigterm_drains_in_flight_stream_then_exits_zero(
        bbr_streaming: BbrProcess, bg: BackgroundLoop) -> None:
    backend = bg.run(EchoBackend("a").start())
    admin, listen = e.free_port(), e.free_port()
    cfg = e.bootstrap(admin, [e.listener(listen, [e.route("a")], [
        e.ext_proc_filter("bbr", request_body_mode="FULL_DUPLEX_STREAMED")])], [
        e.grpc_cluster("bbr", bbr_streaming.port, tls=False),
        e.static_cluster("a", [("127.0.0.1", backend.port)])])
    try:
        with e.Envoy(cfg, admin_port=admin):
            body = b'{"model": "a", "prompt": "slow"}'
            with socket.create_connection(("127.0.0.1", listen)) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\n\r\n" + body[:10])
                time.sleep(0.3)  # the stream is open at BBR now
                bbr_streaming.proc.send_signal(signal.SIGTERM)
                time.sleep(0.3)
                assert bbr_streaming.proc.poll() is None  # still draining
                s.sendall(body[10:])
                reply = s.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200")
            assert bbr_streaming.proc.wait(15) == 0
    finally:
        bg.run(backend.stop())


def test_tls_by_default_with_self_signed_certificate(tmp_path: Path, bg: BackgroundLoop) -> None:
    p = BbrProcess(tmp_path)
    backend = bg.run(EchoBackend("a").start())
    admin, listen = e.free_port(), e.free_port()
    cfg = e.bootstrap(admin, [e.listener(listen, [
        e.route("a", header=("x-gateway-model-name", "a")), e.route("none")],
        [e.ext_proc_filter("bbr")])], [
        e.grpc_cluster("bbr", p.port, tls=True),
        e.static_cluster("a", [("127.0.0.1", backend.port)]),
        e.static_cluster("none", [("127.0.0.1", e.free_port())])])
    try:
        wait_for_port(p.port)
        with e.Envoy(cfg, admin_port=admin):
            r = httpx.post(f"http://127.0.0.1:{listen}/v1/completions",
                           content=b'{"model": "a", "prompt": "x"}')
            assert r.status_code == 200
            assert r.json()["backend"] == "a"
    finally:
        p.stop()
        bg.run(backend.stop())


def test_metrics_can_require_a_bearer_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    p = BbrProcess(tmp_path, "--secure-serving=false", "--metrics-bearer-token-file", str(token))
    try:
        wait_for_port(p.metrics)
        url = f"http://127.0.0.1:{p.metrics}/metrics"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = httpx.get(url, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and "bbr_info" in ok.text
    finally:
        p.stop()


def test_empty_token_file_exits_with_one_line(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("")
    proc = run_bbr("--metrics-bearer-token-file", str(token))
    assert proc.returncode != 0
    assert proc.stderr.strip() == (
        f"bbr: error: cannot read --metrics-bearer-token-file: {token} is empty")
