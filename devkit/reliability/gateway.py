"""A real two-pool gateway for the reliability tests: Envoy → BBR → the matched pool's EPP →
the pool's ``override_host`` cluster, with the real ``bbr`` and ``epp`` commands (TLS on, as
by default) and model servers the test owns. Mirrors ``devkit.stack.envoy_config`` with the body
mode as a parameter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from devkit.overload import DEFAULT, Limits
from devkit.topology import INFERENCE_PATHS, Pool, Topology


class ServiceProcess:
    """``python -m <module>`` (``bbr.main`` or ``epp.main``) on fixed free ports; can be
    killed and started again on the same ports."""

    def __init__(self, module: str, *args: str, log_path: Path | None = None) -> None:
        self.module = module
        self.args = list(args)
        self.port, self.health, self.metrics = e.free_port(), e.free_port(), e.free_port()
        self.log_path = log_path or Path(tempfile.mktemp(prefix=f"{module}-", suffix=".log"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, "--grpc-port", str(self.port),
                 "--grpc-health-port", str(self.health), "--metrics-port", str(self.metrics),
                 "--grace-period", "1", *self.args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self

    def serving(self) -> bool:
        """True when the gRPC health port answers SERVING."""
        try:
            with grpc.insecure_channel(f"127.0.0.1:{self.health}") as ch:
                status = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=0.5).status
        except grpc.RpcError:
            return False
        return bool(status == health_pb2.HealthCheckResponse.SERVING)

    def wait_serving(self, timeout: float = 20) -> ServiceProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.module} exited: {self.log_tail()}")
            if self.serving():
                return self
            time.sleep(0.05)
        raise TimeoutError(f"{self.module} not serving: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: a crash, no drain."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def get(self, path: str, token: str | None = None) -> tuple[int, bytes]:
        """GET a path of the metrics port (``/metrics``, ``/debug/pool``)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.metrics}{path}")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()


@dataclass
class PoolDef:
    """One pool: its name, the model names its route matches, and its servers' addresses."""

    name: str
    models: list[str]
    pods: list[tuple[str, str]]
    port: int
    extra: list[dict[str, Any]] = field(default_factory=list)
    #: hosts in Envoy's pool cluster that are NOT in the EPP's pool: Envoy could reach them,
    #: so a canary there proves no request was steered to it (issue 31, item 12)
    decoys: list[str] = field(default_factory=list)


def gateway_config(pools: list[tuple[PoolDef, int]], bbr_port: int, admin: int, listen: int,
                   *, mode: str, tls: bool = True, failure_mode_allow: bool = False,
                   timeout: str = "10s", runtime: dict[str, Any] | None = None,
                   limits: Limits | None = DEFAULT,
                   buffer_limit: int | None = None,
                   client_cert: tuple[str, str] | None = None) -> dict[str, Any]:
    """Envoy: BBR for every request, then the matched pool's EPP (per route), then the pool's
    ``override_host`` cluster (retrying down the EPP's fallbacks); unknown models get a 404
    from the catch-all route. ``client_cert``: (certificate, key) files Envoy presents to
    the services (mTLS)."""
    return Topology(
        listen=listen, admin=admin, bbr_port=bbr_port, mode=mode, tls=tls,
        client_cert=client_cert,
        failure_mode_allow=failure_mode_allow, timeout=timeout, runtime=runtime,
        pools=[Pool(p.name, models=p.models, epp_port=port,
                    endpoints=[(ip, p.port) for _, ip in p.pods] + [(h, p.port) for h in p.decoys])
               for p, port in pools],
        not_found="no pool serves this model",
        api_paths=INFERENCE_PATHS, limits=limits, buffer_limit=buffer_limit,
    ).bootstrap()


@dataclass
class Gateway:
    """The running gateway; ``url()`` is the client's address."""

    mode: str
    envoy: e.Envoy
    bbr: ServiceProcess
    epps: dict[str, ServiceProcess]
    listen: int
    workdir: Path

    def url(self, path: str = "/v1/completions") -> str:
        return f"http://127.0.0.1:{self.listen}{path}"

    def stop(self) -> None:
        self.envoy.stop()
        self.bbr.stop()
        for p in self.epps.values():
            p.stop()


def start_gateway(workdir: Path, pools: list[PoolDef], *, mode: str,
                  epp_args: tuple[str, ...] = (), bbr_args: tuple[str, ...] = (),
                  failure_mode_allow: bool = False, timeout: str = "10s",
                  runtime: dict[str, Any] | None = None,
                  limits: Limits | None = DEFAULT,
                  buffer_limit: int | None = None,
                  client_cert: tuple[str, str] | None = None) -> Gateway:
    """Start one EPP per pool, BBR and Envoy (everything TLS, as deployed by default);
    ``runtime`` is Envoy's static runtime layer (none: Envoy's defaults); ``limits`` the
    overload limits (:mod:`devkit.overload`; None: Envoy's defaults); ``client_cert`` the
    (certificate, key) files Envoy presents to BBR and the EPPs (with ``--client-ca-file``
    in ``bbr_args``/``epp_args``: mTLS)."""
    workdir.mkdir(parents=True, exist_ok=True)
    epps: dict[str, ServiceProcess] = {}
    for p in pools:
        manifests = workdir / f"{p.name}.yaml"
        write_yaml(manifests, pool_manifests(p.name, p.pods, p.port, p.extra))
        epps[p.name] = ServiceProcess(
            "epp.main", "--manifests", str(manifests), "--pool-name", p.name, *epp_args,
            log_path=workdir / f"epp-{p.name}.log").start()
    streaming = ("--streaming",) if mode == "FULL_DUPLEX_STREAMED" else ()
    bbr = ServiceProcess("bbr.main", *streaming, *bbr_args,
                         log_path=workdir / "bbr.log").start()
    for svc in (*epps.values(), bbr):
        svc.wait_serving()
    admin, listen = e.free_port(), e.free_port()
    cfg = gateway_config([(p, epps[p.name].port) for p in pools], bbr.port, admin, listen,
                         mode=mode, failure_mode_allow=failure_mode_allow, timeout=timeout,
                         runtime=runtime, limits=limits, buffer_limit=buffer_limit,
                         client_cert=client_cert)
    envoy = e.Envoy(cfg, admin_port=admin, workdir=workdir / "envoy").start()
    return Gateway(mode, envoy, bbr, epps, listen, workdir)


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    """Open file descriptors of ``pid``."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid: int) -> int:
    """Threads of ``pid``."""
    return len(os.listdir(f"/proc/{pid}/task"))
