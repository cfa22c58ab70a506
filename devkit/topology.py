"""The one gateway layout builder: what sits in front of the model servers, declared once.

A :class:`Topology` is one Envoy listener with, in order, an optional BBR ext_proc filter
(every request), an optional EPP ext_proc filter (pointed per route at the matched pool's
EPP), one route per pool and model name (``x-gateway-model-name``), and the clusters behind
them. ``gateway-stack``, the reliability kit, the benchmarks and the tests all describe their
gateway with it; :func:`Topology.bootstrap` turns it into an Envoy bootstrap via the small
functions in :mod:`devkit.envoy`.

Example — BBR, then one of two pools' EPPs, then the pool's pods (``override_host``)::

    Topology(listen=8081, admin=9901, bbr_port=9004, pools=[
        Pool("llama", models=["llama-8b"], epp_port=9002, endpoints=[("127.0.10.1", 8000)]),
        Pool("qwen", models=["qwen-7b"], epp_port=9012, endpoints=[("127.0.11.1", 8000)]),
    ], not_found="no pool serves this model").bootstrap()
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from devkit import envoy as e
from devkit import overload
from shared.extproc import DEFAULT_MAX_BODY

EPP_FILTER = "epp-ext-proc"
BBR_FILTER = "bbr-ext-proc"
MODEL_HEADER = "x-gateway-model-name"
#: Envoy's per-connection buffer is 1 MiB by default; above it Envoy itself answers 413 in
#: BUFFERED mode before the services see the body. BUFFERED needs room for a body at the
#: services' cap; FULL_DUPLEX_STREAMED keeps Envoy's 1 MiB. It also bounds the largest chunk
#: Envoy sends an ext_proc service at once and Envoy's own memory per connection: at 32 MiB
#: for every mode, 100 concurrent 100 MB streamed uploads took Envoy to 2.5 GB and BBR to
#: 900 MiB (issue 31; docs/reliability.md).
BUFFER_LIMIT = DEFAULT_MAX_BODY + 1024 * 1024
STREAMED_BUFFER_LIMIT = 1024 * 1024
#: The inference APIs a pool route passes when a layout restricts paths (``gateway-stack``
#: and the reliability kit do; charts: ``experimentalHttpRoute.paths``). Model servers also
#: serve admin paths (``/v1/load_lora_adapter``, ``/reset_prefix_cache``, ``/metrics``,
#: ``/sim/*``, ...) that no client of the gateway should reach. An entry is an exact path;
#: one ending in ``/`` is a prefix. docs/local-stack.md lists the choice.
INFERENCE_PATHS: tuple[str, ...] = (
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
    "/v1/messages", "/v1/messages/count_tokens", "/v1/models", "/v1/score", "/v1/rerank",
    "/v1/audio/transcriptions", "/v1/audio/translations", "/inference/v1/generate",
    "/generate",
)


@dataclass(frozen=True)
class Pool:
    """A pool of model servers behind one route per model name.

    With ``epp_port`` the EPP picks: given the pool's ``endpoints`` (as a Gateway knows them
    from the InferencePool) the upstream is an ``override_host`` cluster and the route retries
    down the EPP's fallback list (:func:`devkit.envoy.pool_cluster`,
    :func:`devkit.envoy.fallback_retry_policy`); without, an ORIGINAL_DST cluster that takes
    one picked endpoint. Without an EPP, ``endpoints`` is a fixed round-robin cluster (a
    Kubernetes Service, in effect). ``models`` empty: the pool takes every request its route
    sees (a catch-all route).
    """

    name: str
    models: Sequence[str] = ()
    epp_port: int | None = None
    endpoints: Sequence[tuple[str, int]] = ()
    #: cluster names; default ``pool-<name>`` and ``epp-<name>``
    cluster: str = ""
    epp_cluster: str = ""
    connect_timeout: str = "1s"
    request_headers_to_add: Sequence[tuple[str, str]] = ()
    #: retries down the EPP's fallback endpoints (``override_host`` pools only)
    num_retries: int = 2
    #: response header that reports the endpoint Envoy recorded as the one that served
    served_header: str | None = None
    #: several EPP replicas as ``(grpc_port, health_port)``: one health-checked cluster
    #: (:func:`devkit.envoy.replica_cluster`) instead of ``epp_port`` alone
    epp_replicas: Sequence[tuple[int, int]] = ()
    #: the pods speak HTTP/2 cleartext (``appProtocol: kubernetes.io/h2c``: gRPC model servers)
    h2c: bool = False
    #: False: the service on ``epp_port`` sees every request but picks nothing (the no-op
    #: ext_proc floor of the overhead benchmark); ``endpoints`` are then a round-robin cluster
    epp_picks: bool = True

    def __post_init__(self) -> None:
        if not self.epp_picks and (self.epp_port is None or not self.endpoints):
            raise ValueError(f"pool {self.name!r}: epp_picks=False needs an epp_port and "
                             "endpoints (a filter that observes, a cluster that balances)")

    @property
    def override_host(self) -> bool:
        return self.epp_port is not None and bool(self.endpoints) and self.epp_picks

    @property
    def upstream(self) -> str:
        return self.cluster or f"pool-{self.name}"

    @property
    def epp(self) -> str:
        return self.epp_cluster or f"epp-{self.name}"


@dataclass
class Topology:
    """One listener: [BBR] → [EPP of the matched pool] → the pool's upstream cluster."""

    listen: int
    admin: int
    pools: Sequence[Pool]
    #: BBR's gRPC port; None: no BBR filter
    bbr_port: int | None = None
    #: request body mode of both filters; the EPP's response body mode is the same for
    #: FULL_DUPLEX_STREAMED and STREAMED otherwise, unless ``response_mode`` says
    mode: str = "FULL_DUPLEX_STREAMED"
    response_mode: str | None = None
    #: TLS from Envoy to the ext_proc services (not verified, as upstream deploys it)
    tls: bool = False
    #: (certificate, key) PEM files Envoy presents to BBR and the EPPs over ``tls`` (mTLS:
    #: the services' ``--client-ca-file`` must trust it); None: no client certificate
    client_cert: tuple[str, str] | None = None
    failure_mode_allow: bool = False
    timeout: str = "10s"
    #: message of the 404 for a model no pool serves; None: no catch-all 404 route
    not_found: str | None = None
    runtime: dict[str, Any] | None = None
    #: the listener's per-connection buffer; None: by mode (:data:`BUFFER_LIMIT` for
    #: BUFFERED, :data:`STREAMED_BUFFER_LIMIT` otherwise); 0: Envoy's default
    buffer_limit: int | None = None
    #: dynamic-metadata namespaces Envoy forwards to the EPP
    epp_forwarding: Sequence[str] = ()
    bbr_filter: str = BBR_FILTER
    epp_filter: str = EPP_FILTER
    extra_clusters: list[dict[str, Any]] = field(default_factory=list)
    #: the listener's name (also its stats prefix); distinct per layout in :func:`bootstrap`
    name: str = "gateway"
    #: OTLP/gRPC port on loopback for Envoy's own OpenTelemetry tracer; None: Envoy traces
    #: nothing (:func:`devkit.envoy.otel_tracing`)
    otlp_port: int | None = None
    #: paths a pool route passes (exact; ending in ``/``: a prefix); others get a JSON 404
    #: ``path_not_found``. None: every path (layouts whose servers are the tests' own)
    api_paths: Sequence[str] | None = None
    #: circuit breakers, slow-client timeouts and JSON refusals (:mod:`devkit.overload`);
    #: None: Envoy's defaults (1,024 requests per cluster, bare 500s)
    limits: overload.Limits | None = overload.DEFAULT

    def _path_matches(self) -> list[dict[str, Any]]:
        """One route match per allowed path (exact, on the path without its query string:
        dot segments or encoded slashes never turn an allowed path into another one on the
        server). One regex would do, but Envoy refuses an RE2 program of this size."""
        if self.api_paths is None:
            return [{"prefix": "/"}]
        return [{"prefix": p} if p.endswith("/") else {"path": p} for p in self.api_paths]

    def filters(self) -> list[dict[str, Any]]:
        """The ext_proc filters in order: BBR, then the EPP (default: the first EPP pool)."""
        out = []
        if self.bbr_port is not None:
            out.append(e.ext_proc_filter("bbr", request_body_mode=self.mode,
                                         name=self.bbr_filter, timeout=self.timeout,
                                         failure_mode_allow=self.failure_mode_allow))
        epp_pools = [p for p in self.pools if p.epp_port is not None]
        if epp_pools:
            response = self.response_mode or (
                self.mode if self.mode == "FULL_DUPLEX_STREAMED" else "STREAMED")
            epp = e.ext_proc_filter(epp_pools[0].epp, request_body_mode=self.mode,
                                    response_body_mode=response, response_headers=True,
                                    name=self.epp_filter, timeout=self.timeout,
                                    failure_mode_allow=self.failure_mode_allow,
                                    replicas=bool(epp_pools[0].epp_replicas))
            if self.epp_forwarding:
                epp["typed_config"]["metadata_options"]["forwarding_namespaces"] = {
                    "untyped": list(self.epp_forwarding)}
            out.append(epp)
        return out

    def _per_route(self, pool: Pool | None) -> dict[str, Any] | None:
        """Point the EPP filter at ``pool``'s EPP, or switch it off for this route."""
        if not any(p.epp_port is not None for p in self.pools):
            return None
        if pool is None or pool.epp_port is None:
            return {self.epp_filter: {"@type": e.EXT_PROC_PER_ROUTE, "disabled": True}}
        service = e.ext_proc_service(pool.epp, replicas=bool(pool.epp_replicas))
        return {self.epp_filter: {"@type": e.EXT_PROC_PER_ROUTE, "overrides": {
            "grpc_service": service}}}

    def _route(self, p: Pool, model: str | None) -> dict[str, Any]:
        r = e.route(p.upstream, header=(MODEL_HEADER, model) if model is not None else None,
                    per_filter=self._per_route(p),
                    request_headers_to_add=p.request_headers_to_add,
                    retry_policy=e.fallback_retry_policy(p.num_retries)
                    if p.override_host else None)
        if p.served_header:
            r["response_headers_to_add"] = [{
                "header": {"key": p.served_header,
                           "value": f"%DYNAMIC_METADATA(envoy.lb:{e.SERVED_KEY})%"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
        return r

    def routes(self) -> list[dict[str, Any]]:
        """One route per (pool, model), catch-all pools next, then the optional 404."""
        pairs: list[tuple[Pool, str | None]] = [(p, m) for p in self.pools for m in p.models]
        pairs += [(p, None) for p in self.pools if not p.models]
        paths = self._path_matches()
        routes = [_with_path(self._route(p, m), path) for p, m in pairs for path in paths]
        if self.not_found is not None:
            known = ", ".join(m for p in self.pools for m in p.models)
            routes += [self._not_found(path, "model_not_found",
                                       f"{self.not_found}; known models: {known}")
                       for path in paths]
        if self.api_paths is not None:
            routes.append(self._not_found({"prefix": "/"}, "path_not_found",
                                          "this path is not an inference API served by the "
                                          "gateway"))
        return routes

    def _not_found(self, match: dict[str, Any], code: str, message: str) -> dict[str, Any]:
        body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
        route: dict[str, Any] = {
            "name": code,  # the model-naming local reply is for this route only
            "match": match,
            "direct_response": {"status": 404, "body": {"inline_string": json.dumps(body)}},
            "response_headers_to_add": [{
                "header": {"key": "content-type", "value": "application/json"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
        }
        per_route = self._per_route(None)
        if per_route:
            route["typed_per_filter_config"] = per_route
        return route

    def clusters(self) -> list[dict[str, Any]]:
        """BBR's, then per pool its EPP's and its upstream."""
        out = []
        if self.bbr_port is not None:
            out.append(e.grpc_cluster("bbr", self.bbr_port, tls=self.tls,
                                      client_cert=self.client_cert))
        for p in self.pools:
            if len(p.epp_replicas) > 1:
                out.append(e.replica_cluster(p.epp, p.epp_replicas, tls=self.tls,
                                             client_cert=self.client_cert))
            elif p.epp_port is not None:
                out.append(e.grpc_cluster(p.epp, p.epp_port, tls=self.tls,
                                          client_cert=self.client_cert))
            if p.override_host:
                out.append(e.pool_cluster(p.upstream, [f"{h}:{port}" for h, port in p.endpoints],
                                          timeout=p.connect_timeout, h2c=p.h2c))
            elif p.endpoints:
                out.append(e.static_cluster(p.upstream, p.endpoints))
            else:
                out.append(e.original_dst_cluster(p.upstream, timeout=p.connect_timeout))
        if self.otlp_port is not None:
            out.append(e.grpc_cluster(e.OTLP_CLUSTER, self.otlp_port, tls=False))
        out += self.extra_clusters
        if self.limits is None:
            return out
        breakers = overload.circuit_breakers(self.limits)
        return [{**cluster, "circuit_breakers": breakers} for cluster in out]

    def local_reply(self) -> dict[str, Any] | None:
        """The catch-all 404 names the model asked for (BBR's header; Envoy fills it in per
        request and escapes it as JSON), as an OpenAI error; None without a catch-all."""
        if self.not_found is None:
            return None
        known = ", ".join(m for p in self.pools for m in p.models)
        error = {"message": f"{self.not_found}: %REQ({MODEL_HEADER})%; known models: {known}",
                 "type": "invalid_request_error", "code": "model_not_found"}
        return {"mappers": [{
            "filter": {"and_filter": {"filters": [
                {"status_code_filter": {"comparison": {
                    "op": "EQ", "value": {"default_value": 404, "runtime_key": "_unused"}}}},
                {"header_filter": {"header": {"name": MODEL_HEADER, "present_match": True}}},
                # not the path_not_found 404 (a request to an admin path names a model too)
                {"extension_filter": {
                    "name": "envoy.access_loggers.extension_filters.cel",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters"
                                 ".cel.v3.ExpressionFilter",
                        "expression": "xds.route_name == 'model_not_found'"}}},
            ]}},
            "body_format_override": {"json_format": {"error": error}},
        }]}

    def listener(self) -> dict[str, Any]:
        """This layout's Envoy listener."""
        lst = e.listener(self.listen, self.routes(), self.filters(), name=self.name)
        limit = self.buffer_limit
        if limit is None:
            limit = BUFFER_LIMIT if self.mode == "BUFFERED" else STREAMED_BUFFER_LIMIT
        if limit:
            lst["per_connection_buffer_limit_bytes"] = limit
        if self.limits is not None:
            overload.apply(lst, [], self.limits)
        hcm = lst["filter_chains"][0]["filters"][0]["typed_config"]
        if (reply := self.local_reply()) is not None:
            # The model-naming 404 first: Envoy uses the first mapper that matches.
            hcm["local_reply_config"] = {"mappers": [
                *reply["mappers"], *hcm.get("local_reply_config", {}).get("mappers", [])]}
        if self.otlp_port is not None:
            hcm["tracing"] = e.otel_tracing()
        return lst

    def bootstrap(self) -> dict[str, Any]:
        """The Envoy bootstrap for this layout."""
        return e.bootstrap(self.admin, [self.listener()], self.clusters(), runtime=self.runtime)


def _with_path(route: dict[str, Any], path: dict[str, Any]) -> dict[str, Any]:
    """``route`` matching ``path`` instead of every path."""
    match = {k: v for k, v in route["match"].items() if k != "prefix"}
    return {**route, "match": {**path, **match}}


def bootstrap(layouts: Sequence[Topology]) -> dict[str, Any]:
    """One Envoy serving several layouts side by side, one listener each (benchmarks that
    compare layouts under the same proxy). The admin port and runtime are the first layout's;
    a cluster two layouts declare must be the same cluster."""
    if not layouts:
        raise ValueError("no layout to serve")
    names = [t.name for t in layouts]
    if len(set(names)) != len(names):
        raise ValueError(f"layouts need distinct names, got {names}")
    clusters: dict[str, dict[str, Any]] = {}
    for layout in layouts:
        for cluster in layout.clusters():
            known = clusters.setdefault(cluster["name"], cluster)
            if known != cluster:
                raise ValueError(f"cluster {cluster['name']!r} is declared differently by "
                                 f"two layouts")
    first = layouts[0]
    return e.bootstrap(first.admin, [t.listener() for t in layouts], list(clusters.values()),
                       runtime=first.runtime)
