"""Run a container's probes the way kubelet does, against a process on loopback.

Only what kubelet itself does: a ``grpc`` probe calls ``grpc.health.v1.Health/Check`` with the
probe's service name (default ``""``) over plaintext and passes on SERVING only; a
``tcpSocket`` probe passes when a TCP connection opens; an ``httpGet`` probe passes on a
status from 200 to 399 (HTTPS without certificate verification). Named ports resolve through
the container's ``ports``. ``timeoutSeconds`` defaults to 1, as in Kubernetes.
"""

from __future__ import annotations

import socket
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

HOST = "127.0.0.1"


def resolve_port(port: int | str, container: dict[str, Any]) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"probe names port {port!r}, which the container does not declare")


def run_probe(probe: dict[str, Any], container: dict[str, Any]) -> tuple[bool, str]:
    """One probe attempt: (passed, what happened)."""
    timeout = float(probe.get("timeoutSeconds", 1))
    if "grpc" in probe:
        spec = probe["grpc"]
        if not isinstance(spec["port"], int):  # the API server rejects named gRPC ports
            raise ValueError(f"grpc probe port must be a number, got {spec['port']!r}")
        service = spec.get("service", "")
        try:
            with grpc.insecure_channel(f"{HOST}:{spec['port']}") as ch:
                status = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=timeout).status
        except grpc.RpcError as e:
            return False, f"grpc service {service!r}: {e.code().name}"
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
        return status == health_pb2.HealthCheckResponse.SERVING, f"grpc {service!r}: {name}"
    if "tcpSocket" in probe:
        port = resolve_port(probe["tcpSocket"]["port"], container)
        try:
            with socket.create_connection((HOST, port), timeout=timeout):
                return True, f"tcp {port}: open"
        except OSError as e:
            return False, f"tcp {port}: {e}"
    if "httpGet" in probe:
        spec = probe["httpGet"]
        port = resolve_port(spec["port"], container)
        scheme = spec.get("scheme", "HTTP").lower()
        headers = {h["name"]: h["value"] for h in spec.get("httpHeaders", [])}
        url = f"{scheme}://{HOST}:{port}{spec.get('path', '/')}"
        try:
            r = httpx.get(url, headers=headers, timeout=timeout, verify=False)
        except httpx.HTTPError as e:
            return False, f"GET {url}: {e!r}"
        return 200 <= r.status_code < 400, f"GET {url}: {r.status_code}"
    raise ValueError(f"unsupported probe handler: {sorted(probe)}")
