"""llm-d-router v0.10 request-control plugins: ``agent-identity`` (a request-header
processor) and ``session-id-producer``, and what reads their attributes (session affinity,
the flow-control fairness id)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from epp.config import build
from epp.config.builtins import builtin_registry
from epp.config.loader import parse_config
from epp.flowcontrol.types import fairness_id
from epp.requestcontrol import Director
from epp.scheduling import LLMRequest
from shared.plugins import PluginError
from tests.epp.unit.test_director import HEADERS, body, store


def plugin(type_name: str, **params: Any) -> Any:
    return builtin_registry().create(type_name, "", params)


def req(headers: dict[str, str]) -> LLMRequest:
    return LLMRequest(request_id="r", target_model="m", headers=headers)


@pytest.mark.parametrize(("headers", "identity"), [
    ({"x-claude-code-session-id": "cc", "x-session-affinity": "oc"}, "cc"),
    ({"x-session-affinity": "oc", "session-id": "cx"}, "oc"),
    ({"session-id": "cx", "session_id": "old"}, "cx"),
    ({"session_id": "old"}, "old"),
    ({"session-id": "  "}, None),
    ({}, None),
])
def test_agent_identity_reads_the_agent_headers_in_order(headers: dict[str, str],
                                                         identity: str | None) -> None:
    r = req(headers)
    plugin("agent-identity").produce(r, [])
    assert r.plugin_state.get("agent-identity") == identity


def test_agent_identity_additional_headers_come_first() -> None:
    r = req({"x-my-agent": "mine", "x-claude-code-session-id": "cc"})
    plugin("agent-identity", additionalSessionHeaders=["X-My-Agent"]).produce(r, [])
    assert r.plugin_state["agent-identity"] == "mine"


def test_fairness_id_falls_back_to_the_agent_identity() -> None:
    r = req({})
    assert fairness_id(r) == "default-flow"
    r.plugin_state["agent-identity"] = "agent-7"
    assert fairness_id(r) == "agent-7"
    explicit = req({"x-gateway-inference-fairness-id": "tenant"})
    explicit.plugin_state["agent-identity"] = "agent-7"
    assert fairness_id(explicit) == "tenant"


def test_session_id_producer_header_and_cookie() -> None:
    by_header = plugin("session-id-producer", headerName="X-Session-ID")
    r = req({"x-session-id": "s1"})
    by_header.produce(r, [])
    assert r.plugin_state["SessionIDDataKey/session-id-producer"] == "s1"
    by_cookie = plugin("session-id-producer", cookieName="llm-d-session")
    r = req({"cookie": "a=b; llm-d-session=s2; c=d"})
    by_cookie.produce(r, [])
    assert r.plugin_state["SessionIDDataKey/session-id-producer"] == "s2"
    for headers in ({}, {"cookie": "other=1"}, {"cookie": "bad cookie ;;=\x00"}):
        r = req(headers)
        by_cookie.produce(r, [])
        assert r.plugin_state == {}


def test_session_id_producer_needs_exactly_one_source() -> None:
    for params in ({}, {"headerName": "a", "cookieName": "b"}):
        with pytest.raises(PluginError, match="exactly one"):
            plugin("session-id-producer", **params)


PIN_BY = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-affinity-filter
  parameters:
    strategy: session_id
    sessionIdConfig: {sources: [{attribute: %s}]}
- type: %s
- type: random-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: session-affinity-filter}, {pluginRef: random-picker}]
"""


@pytest.mark.parametrize(("source", "producer", "headers"), [
    ("agent-identity", "agent-identity", {"x-claude-code-session-id": "agent-1"}),
    ("SessionIDDataKey/session-id-producer",
     "session-id-producer\n  parameters: {cookieName: sid}", {"cookie": "sid=abc"}),
])
def test_a_session_attribute_pins_requests_through_the_director(
        source: str, producer: str, headers: dict[str, str]) -> None:
    d = Director.of(build(parse_config(PIN_BY % (source, producer)), store()))
    served: Counter[str] = Counter()
    for i in range(12):
        _, routed = d.route({**HEADERS, "x-request-id": f"r{i}", **headers}, body(), {})
        served[routed.endpoint.key] += 1
        d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
                 completion_tokens=1)
    assert len(served) == 1  # random-picker alone spreads 12 requests over the pool


P2P = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {blockSizeTokens: 16}
- type: p2p-source-producer
  parameters: {minCachedTokenDelta: %d}
- type: header-based-testing-filter
schedulingProfiles:
- name: default
  plugins: [{pluginRef: header-based-testing-filter}]
"""


def routed_to(d: Director, key: str, rid: str, **extra: str) -> Any:
    decision, routed = d.route({**HEADERS, "x-request-id": rid,
                                "test-epp-endpoint-selection": key, **extra},
                               body("shared system prompt " * 40), {})
    d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=1)
    return decision


def test_p2p_source_names_the_pod_holding_the_prefix_when_another_computes_it() -> None:
    ds = store()
    a, b = (v.key for v in ds.views()[:2])
    d = Director.of(build(parse_config(P2P % 1), ds))
    first = routed_to(d, a, "r1")
    assert "x-kv-cache-source-host-port" not in first.set_headers  # nothing cached anywhere
    second = routed_to(d, b, "r2")
    assert second.set_headers["x-kv-cache-source-host-port"] == a
    third = routed_to(d, a, "r3")  # the computing pod holds it itself: no pull
    assert "x-kv-cache-source-host-port" not in third.set_headers


def test_p2p_source_needs_the_minimum_delta_and_strips_a_clients_header() -> None:
    ds = store()
    a, b = (v.key for v in ds.views()[:2])
    d = Director.of(build(parse_config(P2P % 100000), ds))
    routed_to(d, a, "r1")
    forged = routed_to(d, b, "r2", **{"x-kv-cache-source-host-port": "10.0.0.99:1"})
    assert "x-kv-cache-source-host-port" not in forged.set_headers
    assert "x-kv-cache-source-host-port" in forged.remove_headers


def test_p2p_source_refuses_a_producer_that_is_not_one() -> None:
    from epp.config.loader import ConfigError

    text = P2P.replace("{minCachedTokenDelta: %d}", "{prefixMatchInfoProducerName: "
                       "header-based-testing-filter}")
    with pytest.raises(ConfigError, match="not a prefix-cache producer"):
        build(parse_config(text), store())
    with pytest.raises(PluginError, match="minCachedTokenDelta"):
        plugin("p2p-source-producer", minCachedTokenDelta=0)
