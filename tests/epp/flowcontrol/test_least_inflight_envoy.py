"""``least-inflight-fairness-policy`` end to end: real Envoy → real ``epp`` (flow control on
the ``concurrency-detector``, 2 slots) → a small real model server that holds requests until
the test lets them go. The freed slot goes to the tenant holding the fewest requests, and
each tenant's in-flight count (``/debug/pool``) ends with its response, also when the client
goes away."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.epp.flowcontrol.test_flowcontrol_envoy import Gateway, until
from tests.support.picker import start_servers
from tests.support.processes import BackgroundLoop, FakeModelServer

pytestmark = pytest.mark.envoy

CONFIG = """\
featureGates: [flowControl]
plugins:
- type: concurrency-detector
  parameters: {maxConcurrency: 2}
- type: least-inflight-fairness-policy
saturationDetector: {pluginRef: concurrency-detector}
flowControl:
  defaultRequestTTL: 60s
  defaultPriorityBand: {fairnessPolicyRef: least-inflight-fairness-policy}
"""


@pytest.fixture
def server(bg: BackgroundLoop) -> Iterator[FakeModelServer]:
    [s] = start_servers(bg, 1)
    s.hold = True
    yield s
    s.released = 10**6
    bg.run(s.stop())


@pytest.fixture
def gw(bg: BackgroundLoop, tmp_path: Path, server: FakeModelServer) -> Iterator[Gateway]:
    g = Gateway(bg, tmp_path, server, config=CONFIG)
    yield g
    g.stop()


def inflight(gw: Gateway) -> dict[str, int]:
    [band] = [b for b in gw.debug()["bands"] if b["priority"] == 0]
    counts: dict[str, int] = band["inflight"]
    return counts


def test_the_freed_slot_goes_to_the_tenant_holding_fewest(gw: Gateway,
                                                         server: FakeModelServer) -> None:
    held = []
    for i in range(2):  # one after the other: the server releases them in arrival order
        held.append(gw.send_async("standard", f"a{i}", tenant="a"))
        until(lambda i=i: len(server.requests) == i + 1, f"a{i} to reach the server")
    assert inflight(gw) == {"a": 2}
    waiting = [gw.send_async("standard", "a-waits", tenant="a")]
    until(lambda: gw.debug()["queued"] == 1, "a's third request to be queued")
    waiting.append(gw.send_async("standard", "b-waits", tenant="b"))
    until(lambda: gw.debug()["queued"] == 2, "b's request to be queued")
    server.released = 1  # a's first request ends: one slot frees
    until(lambda: len(server.requests) == 3, "the next release to reach the server")
    assert server.requests[2]["body"]["prompt"] == "b-waits"  # round-robin: "a-waits"
    assert held[0].result(timeout=30).status_code == 200
    until(lambda: inflight(gw) == {"a": 1, "b": 1}, "the counts to follow")
    server.released = 10**6
    assert all(f.result(timeout=30).status_code == 200 for f in [*held[1:], *waiting])
    until(lambda: inflight(gw) == {}, "every tenant's count to end with its response")


def test_a_client_gone_mid_response_ends_its_tenants_count(gw: Gateway,
                                                           server: FakeModelServer) -> None:
    body = orjson.dumps({"model": "base-model", "prompt": "c0", "max_tokens": 1})
    client = socket.create_connection(("127.0.0.1", gw.port))
    client.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\n"
                   b"content-type: application/json\r\n"
                   b"x-gateway-inference-objective: standard\r\n"
                   b"x-gateway-inference-fairness-id: c\r\n"
                   b"content-length: %d\r\n\r\n%s" % (len(body), body))
    until(lambda: len(server.requests) == 1, "c's request to reach the server")
    assert inflight(gw) == {"c": 1}
    client.close()  # the client hangs up while the server holds the request
    until(lambda: inflight(gw) == {}, "the broken stream to end c's count")
