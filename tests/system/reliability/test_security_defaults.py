"""Security defaults: TLS on the ext_proc port (with live certificate reload while Envoy is
connected), the metrics bearer token, and no secrets or bodies in info-level logs.

Charts (non-root, read-only root filesystem) are covered by ``tests/charts/test_charts.py``.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from cryptography import x509

from devkit import envoy as e
from devkit.reliability.gateway import PoolDef, ServiceProcess, gateway_config, start_gateway
from shared.tls import self_signed
from tests.support.processes import BackgroundLoop, EchoBackend, FakeModelServer
from tests.support.two_pools import LLAMA, TwoPools

pytestmark = pytest.mark.envoy

SECRET_PROMPT = "my password is hunter2-XYZZY-0451"
SECRET_TOKEN = "sk-live-DEADBEEF-do-not-log"


def served_certificate(port: int) -> x509.Certificate:
    """The certificate the TLS server on ``port`` presents now (fresh handshake)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def write_pair(cert_dir: Path) -> int:
    """A new self-signed pair in ``cert_dir`` (atomically); its serial number."""
    key_pem, cert_pem = self_signed()
    for name, data in (("tls.key", key_pem), ("tls.crt", cert_pem)):
        tmp = cert_dir / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, cert_dir / name)
    return x509.load_pem_x509_certificate(cert_pem).serial_number


@pytest.mark.parametrize("module", ["bbr.main", "epp.main"])
def test_ext_proc_port_speaks_tls_by_default(module: str, tmp_path: Path) -> None:
    args: tuple[str, ...] = ()
    if module == "epp.main":
        manifests = tmp_path / "m.yaml"
        from devkit.manifests import pool_manifests, write_yaml
        write_yaml(manifests, pool_manifests("p", [("a", "127.0.0.1")], 1))
        args = ("--manifests", str(manifests))
    svc = ServiceProcess(module, *args, log_path=tmp_path / "svc.log").start()
    try:
        svc.wait_serving()
        assert served_certificate(svc.port).serial_number > 0
    finally:
        svc.stop()


@pytest.fixture
def echo(bg: BackgroundLoop) -> Iterator[EchoBackend]:
    server = bg.run(EchoBackend("echo").start())
    yield server
    bg.run(server.stop())


def test_certificate_rotation_is_served_live_with_envoy_connected(
        tmp_path: Path, echo: EchoBackend) -> None:
    cert_dir = tmp_path / "certs"
    cert_dir.mkdir()
    first = write_pair(cert_dir)
    bbr = ServiceProcess("bbr.main", "--cert-path", str(cert_dir),
                         log_path=tmp_path / "bbr.log").start().wait_serving()
    admin, listen = e.free_port(), e.free_port()
    cfg = e.bootstrap(admin, [e.listener(listen, [e.route("echo")], [
        e.ext_proc_filter("bbr", request_body_mode="BUFFERED")])],
        [e.grpc_cluster("bbr", bbr.port, tls=True),
         e.static_cluster("echo", [("127.0.0.1", echo.port)])])
    envoy = e.Envoy(cfg, admin_port=admin, workdir=tmp_path / "envoy").start()
    url = f"http://127.0.0.1:{listen}/v1/completions"
    body = orjson.dumps({"model": "m", "prompt": "x"})
    try:
        assert served_certificate(bbr.port).serial_number == first
        assert httpx.post(url, content=body).json()["headers"]["x-gateway-model-name"] == "m"
        time.sleep(0.01)  # a distinct mtime for the rotated files
        second = write_pair(cert_dir)
        statuses = [httpx.post(url, content=body).status_code for _ in range(20)]
        assert served_certificate(bbr.port).serial_number == second
        assert statuses == [200] * 20
        assert '"certificate reloaded"' in bbr.log_text()
    finally:
        envoy.stop()
        bbr.stop()


@pytest.mark.parametrize("module", ["bbr.main", "epp.main"])
def test_metrics_port_requires_the_bearer_token_when_configured(module: str,
                                                                 tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(SECRET_TOKEN + "\n")
    args: tuple[str, ...] = ("--metrics-bearer-token-file", str(token_file),
                             "--secure-serving=false")
    if module == "epp.main":
        from devkit.manifests import pool_manifests, write_yaml
        write_yaml(tmp_path / "m.yaml", pool_manifests("p", [("a", "127.0.0.1")], 1))
        args += ("--manifests", str(tmp_path / "m.yaml"))
    svc = ServiceProcess(module, *args, log_path=tmp_path / "svc.log").start()
    try:
        svc.wait_serving()
        e.wait_for_port(svc.metrics)
        assert svc.get("/metrics")[0] == 401
        assert svc.get("/metrics", token="wrong")[0] == 401
        status, text = svc.get("/metrics", token=SECRET_TOKEN)
        assert status == 200 and b"# TYPE" in text
        assert SECRET_TOKEN not in svc.log_text()
    finally:
        svc.stop()


def test_prompts_and_authorization_headers_stay_out_of_info_logs(two_pools: TwoPools) -> None:
    tp = two_pools
    for path, payload in (("/v1/completions", {"prompt": SECRET_PROMPT}),
                          ("/v1/chat/completions",
                           {"messages": [{"role": "user", "content": SECRET_PROMPT}]})):
        r = httpx.post(tp.gateway.url(path), headers={"authorization": f"Bearer {SECRET_TOKEN}"},
                       content=orjson.dumps({"model": LLAMA[0], **payload}))
        assert r.status_code == 200
    bad = httpx.post(tp.gateway.url(), headers={"authorization": f"Bearer {SECRET_TOKEN}"},
                     content=b'{"model": "llama-8b", "prompt": "' + SECRET_PROMPT.encode())
    assert bad.status_code == 400
    logs = tp.gateway.bbr.log_text() + "".join(p.log_text() for p in tp.gateway.epps.values())
    assert logs  # the services did log (start-up lines)
    assert SECRET_PROMPT not in logs and "hunter2" not in logs
    assert SECRET_TOKEN not in logs


def _health(port: int, client: tuple[bytes, bytes] | None) -> str:
    """The gRPC health answer on the ext_proc port over TLS (server not verified, as Envoy
    does), presenting ``client`` (key, cert) or no certificate; the error code on failure."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    server_cert = ssl.get_server_certificate(("127.0.0.1", port)).encode()
    creds = grpc.ssl_channel_credentials(
        root_certificates=server_cert,
        private_key=client[0] if client else None,
        certificate_chain=client[1] if client else None)
    opts = [("grpc.ssl_target_name_override", "inference-gateway")]
    with grpc.secure_channel(f"127.0.0.1:{port}", creds, options=opts) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        except grpc.RpcError as err:
            return str(err.code())
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_client_ca_file_requires_a_client_certificate(tmp_path: Path) -> None:
    """Issue 31, item 11: the ext_proc port accepted any TLS client. With --client-ca-file
    only clients holding a certificate that CA signed get through (mTLS)."""
    from devkit.manifests import pool_manifests, write_yaml

    manifests = tmp_path / "m.yaml"
    write_yaml(manifests, pool_manifests("p", [("a", "127.0.0.1")], 1))
    trusted, rogue = self_signed("gateway"), self_signed("rogue")
    ca = tmp_path / "ca.pem"
    ca.write_bytes(trusted[1])
    svc = ServiceProcess("epp.main", "--manifests", str(manifests), "--health-checking",
                         "--client-ca-file", str(ca), log_path=tmp_path / "epp.log").start()
    try:
        svc.wait_serving()
        assert _health(svc.port, trusted) == "SERVING"
        assert _health(svc.port, None) == "StatusCode.UNAVAILABLE"
        assert _health(svc.port, rogue) == "StatusCode.UNAVAILABLE"
    finally:
        svc.stop()


@pytest.fixture
def one_server(bg: BackgroundLoop) -> Iterator[FakeModelServer]:
    server = bg.run(FakeModelServer("m0", "127.0.23.1", e.free_port()).start())
    server.model = "llama-8b"
    yield server
    bg.run(server.stop())


def test_envoy_presents_a_client_certificate_and_envoys_without_one_are_refused(
        tmp_path: Path, one_server: FakeModelServer) -> None:
    """Issue 31, item 11, through the real Envoy: BBR and the EPP started with
    ``--client-ca-file`` take the streams of an Envoy presenting a certificate that CA
    signed (every request served), and refuse at the TLS handshake an Envoy presenting none
    or another one: its clients get a JSON 503 and no request reaches the model server."""
    trusted, rogue = self_signed("gateway"), self_signed("rogue")
    files = {}
    for name, (key, cert) in (("trusted", trusted), ("rogue", rogue)):
        (tmp_path / f"{name}.key").write_bytes(key)
        (tmp_path / f"{name}.crt").write_bytes(cert)
        files[name] = (str(tmp_path / f"{name}.crt"), str(tmp_path / f"{name}.key"))
    ca = ("--client-ca-file", files["trusted"][0])
    pool = PoolDef("llama", ["llama-8b"], [(one_server.name, one_server.host)],
                   one_server.port)
    gw = start_gateway(tmp_path / "gw", [pool], mode="FULL_DUPLEX_STREAMED", bbr_args=ca,
                       epp_args=ca, client_cert=files["trusted"])
    body = {"model": "llama-8b", "prompt": "hello"}
    try:
        answers = [httpx.post(gw.url(), json=body, timeout=30) for _ in range(5)]
        assert [r.status_code for r in answers] == [200] * 5
        assert len(one_server.requests) == 5
        for run, client_cert in enumerate((None, files["rogue"])):
            admin, listen = e.free_port(), e.free_port()
            cfg = gateway_config([(pool, gw.epps["llama"].port)], gw.bbr.port, admin, listen,
                                 mode="FULL_DUPLEX_STREAMED", client_cert=client_cert)
            with e.Envoy(cfg, admin_port=admin, workdir=tmp_path / f"envoy-{run}"):
                refused = httpx.post(f"http://127.0.0.1:{listen}/v1/completions", json=body,
                                     timeout=30)
            assert refused.status_code == 503, refused.text
            assert refused.headers["content-type"] == "application/json"
            assert refused.json()["error"]["code"] == "service_unavailable"
        assert len(one_server.requests) == 5
    finally:
        gw.stop()
