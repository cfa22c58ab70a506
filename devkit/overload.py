"""Envoy's limits for a gateway under hostile load: circuit breakers, timeouts, JSON refusals.

Without these, Envoy's default circuit breaker (1,024 concurrent requests per cluster) let
~1,024 slow clients — each holding a BBR stream with headers and half a body — take every
pool down, and every refusal was a bare ``500`` (issue 31, item 1). :class:`Limits` holds the
choices; :func:`apply` writes them into a listener and its clusters:

- **circuit breakers** on every cluster (ext_proc services and pools): ``max_requests``
  concurrent requests / streams, as many pending, connections and retries bounded too;
- **timeouts that shed slow clients** on the listener: ``request_headers_timeout`` (headers
  must arrive within it), ``request_timeout`` (the whole request body must have arrived and
  gone upstream within it), ``stream_idle_timeout`` (no byte either way for this long);
- **refusals in the OpenAI error shape**: Envoy's own local replies (overflow, no healthy
  upstream, an ext_proc stream that could not be opened, a timeout) get a JSON body
  ``{"error": {"message", "type", "code"}}``; a 500 that Envoy makes up (ext_proc or
  circuit-breaker failures) is answered 503, and a cut-short request 408. The services' own
  JSON errors (400, 404, 413, 429, 503 from BBR and the EPP) carry no response flag and pass
  unchanged.

The numbers are in :class:`Limits` and documented in docs/reliability.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HCM = "envoy.filters.network.http_connection_manager"


@dataclass(frozen=True)
class Limits:
    """One gateway's overload limits (defaults: what ``gateway-stack`` runs)."""

    #: concurrent requests (HTTP/2: streams) per cluster; Envoy's default is 1,024. BBR holds
    #: one stream per request still sending its body, so this bounds how many slow clients
    #: can be held at once; beyond it, a JSON 503 rather than a bare 500.
    max_requests: int = 16_384
    #: connections per cluster (HTTP/1 pools open one per concurrent request)
    max_connections: int = 16_384
    max_retries: int = 64
    request_headers_timeout: str = "10s"
    #: the body must be complete within this (also bounds an EPP flow-control wait in
    #: BUFFERED mode, when the request goes upstream only after the pick)
    request_timeout: str = "120s"
    stream_idle_timeout: str = "120s"


def circuit_breakers(limits: Limits) -> dict[str, Any]:
    """A cluster's ``circuit_breakers`` for ``limits``."""
    return {"thresholds": [{
        "priority": "DEFAULT",
        "max_requests": limits.max_requests,
        "max_pending_requests": limits.max_requests,
        "max_connections": limits.max_connections,
        "max_retries": limits.max_retries,
    }]}


def _json_reply(code: str, kind: str) -> dict[str, Any]:
    return {"json_format": {"error": {"message": "%LOCAL_REPLY_BODY%", "type": kind,
                                      "code": code}},
            "content_type": "application/json"}


def local_reply_config() -> dict[str, Any]:
    """Envoy's own refusals as OpenAI-shaped JSON; the services' replies are untouched."""
    envoy_made = {"response_flag_filter": {"flags": [
        "UO", "UH", "UF", "URX", "UC", "UT", "LR", "UMSDR", "NC", "OM", "DO"]}}

    def status(code: int) -> dict[str, Any]:
        return {"status_code_filter": {"comparison": {
            "op": "EQ", "value": {"default_value": code, "runtime_key": f"overload.{code}"}}}}

    return {"mappers": [
        # An ext_proc stream that could not be opened or failed (circuit breaker, service
        # gone): Envoy says 500; it is an unavailable dependency, so 503 like upstream's.
        {"filter": status(500), "status_code": 503,
         "body_format_override": _json_reply("service_unavailable", "server_error")},
        # Envoy's own 413 (a BUFFERED body over its buffer), not the services' JSON 413s:
        # told apart by the reply's details (a CEL filter; no other filter sees them).
        {"filter": {"and_filter": {"filters": [status(413), {"extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3"
                         ".ExpressionFilter",
                "expression": "response.code_details == 'request_payload_too_large'"}}}]}},
         "body_format_override": _json_reply("request_too_large", "invalid_request_error")},
        {"filter": status(408), "body_format_override": _json_reply("request_timeout",
                                                                     "invalid_request_error")},
        {"filter": status(504), "body_format_override": _json_reply("upstream_timeout",
                                                                     "server_error")},
        {"filter": {"and_filter": {"filters": [status(503), envoy_made]}},
         "body_format_override": _json_reply("service_unavailable", "server_error")},
    ]}


def apply(listener: dict[str, Any], clusters: list[dict[str, Any]], limits: Limits) -> None:
    """Write ``limits`` into ``listener`` (its HTTP connection manager) and ``clusters``."""
    for chain in listener["filter_chains"]:
        for f in chain["filters"]:
            if f["name"] == HCM:
                hcm = f["typed_config"]
                hcm["request_headers_timeout"] = limits.request_headers_timeout
                hcm["request_timeout"] = limits.request_timeout
                hcm["stream_idle_timeout"] = limits.stream_idle_timeout
                hcm["local_reply_config"] = local_reply_config()
    for cluster in clusters:
        cluster["circuit_breakers"] = circuit_breakers(limits)


#: The limits ``gateway-stack``, the reliability kit and :class:`devkit.topology.Topology` use
#: unless told otherwise.
DEFAULT = Limits()
