"""``header-based-testing-filter``: keep the endpoints a test names in a request header.

Upstream registers it for the conformance tests (a test pins the endpoint it expects). Keep it
out of production configs: with it in a profile, the client chooses the endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.request import LLMRequest

#: The header upstream's conformance tests set.
TEST_HEADER = "test-epp-endpoint-selection"


def _host(text: str) -> str:
    return text.strip().strip("[]")


class HeaderBasedTestingFilter(Filter):
    """Keeps the endpoints listed in ``test-epp-endpoint-selection`` (comma-separated
    ``ip`` or ``ip:port``; ``[v6]:port`` for IPv6), in the header's order, one per IP.
    ``ip:port`` must match exactly; a bare ``ip`` picks that IP's first endpoint. No header,
    or nothing it names in the pool: no endpoint (so the test sees a failure, not a guess)."""

    type_name = "header-based-testing-filter"

    def filter(self, request: LLMRequest,
               endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        raw = request.headers.get(TEST_HEADER, "")
        if not raw.strip():
            return []
        by_ip: dict[str, EndpointView] = {}
        by_key: dict[str, EndpointView] = {}
        for v in endpoints:
            ip = _host(v.endpoint.address)
            by_ip.setdefault(ip, v)
            by_key[f"{ip}:{v.endpoint.port}"] = v
        out: list[EndpointView] = []
        seen: set[str] = set()
        for item in (i.strip() for i in raw.split(",")):
            if not item:
                continue
            host, port = item, ""
            if item.startswith("["):  # [v6]:port or [v6]
                host, _, rest = item[1:].partition("]")
                port = rest[1:] if rest.startswith(":") else ""
            elif item.count(":") == 1:
                host, port = item.split(":")
            host = _host(host)
            found = by_key.get(f"{host}:{port}") if port else by_ip.get(host)
            if found is not None and _host(found.endpoint.address) not in seen:
                seen.add(_host(found.endpoint.address))
                out.append(found)
        return out
