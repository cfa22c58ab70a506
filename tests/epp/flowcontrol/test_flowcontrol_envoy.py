"""Flow control end to end: real Envoy → real ``epp`` (``featureGates: [flowControl]``) →
a small real model server whose scraped queue the test sets, which makes the pool saturated
or not (the order tests instead hold requests on the server, and one request in flight fills
the pool). Requests wait in the EPP, are released in band order, and get 429/503 answers
with ``retry-after``; a client that goes away frees its place at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from tests.support.picker import start_servers
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer, pool_gateway_config

pytestmark = pytest.mark.envoy

X = "inference.networking.x-k8s.io/v1alpha2"
OBJECTIVES = [
    {"apiVersion": X, "kind": "InferenceObjective", "metadata": {"name": name},
     "spec": {"poolRef": {"name": "pool"}, "priority": prio}}
    for name, prio in (("critical", 10), ("standard", 0), ("batch", -1))
]
# One waiting request on the server saturates the pool (queue / 1 >= 1).
SCRAPED_QUEUE = "{type: utilization-detector, name: detector, parameters: {queueDepthThreshold: 1}}"
# One request in flight saturates the pool: the EPP's own count, so the order requests reach
# the server is its release order (a scrape could report a released request's place free
# before the request reaches the server, and let the next one overtake it).
ONE_IN_FLIGHT = "{type: concurrency-detector, name: detector, parameters: {maxConcurrency: 1}}"
CONFIG = """\
featureGates: [flowControl]
plugins:
- %s
- {type: round-robin-fairness-policy, name: tenants}
saturationDetector: {pluginRef: detector}
flowControl:
  defaultRequestTTL: %s
  priorityBands:
  - {priority: 0, maxRequests: 2}
  - {priority: 10, fairnessPolicyRef: tenants}
"""


class Gateway:
    def __init__(self, bg: BackgroundLoop, tmp: Path, server: FakeModelServer,
                 ttl: str = "60s", detector: str = SCRAPED_QUEUE,
                 config: str | None = None) -> None:
        manifests = tmp / "pool.yaml"
        write_yaml(manifests, pool_manifests("pool", [(server.name, server.host)],
                                             server.port, OBJECTIVES))
        self.epp = EppProcess(manifests, "--config-text", config or CONFIG % (detector, ttl),
                              "--refresh-metrics-interval", "20ms",
                              log_path=tmp / "epp.log").wait_serving()
        admin, self.port = e.free_port(), e.free_port()
        self.envoy = e.Envoy(pool_gateway_config(self.epp.port, admin, self.port),
                             admin_port=admin, workdir=tmp / "envoy").start()
        self.pool = ThreadPoolExecutor(8)

    def send(self, objective: str, tag: str, *, timeout: float = 60,
             tenant: str | None = None) -> httpx.Response:
        headers = {"x-gateway-inference-objective": objective}
        if tenant:
            headers["x-gateway-inference-fairness-id"] = tenant
        body = orjson.dumps({"model": "base-model", "prompt": tag, "max_tokens": 1})
        return httpx.post(f"http://127.0.0.1:{self.port}/v1/completions", content=body,
                          headers=headers, timeout=timeout)

    def send_async(self, *args: Any, **kw: Any) -> Future[httpx.Response]:
        return self.pool.submit(self.send, *args, **kw)

    def debug(self) -> dict[str, Any]:
        fc: dict[str, Any] = self.debug_pool()["flowControl"]
        return fc

    def debug_pool(self) -> dict[str, Any]:
        r = httpx.get(f"http://127.0.0.1:{self.epp.metrics}/debug/pool", timeout=5)
        body: dict[str, Any] = r.json()
        return body

    def fill(self, server: FakeModelServer) -> Future[httpx.Response]:
        """With ``ONE_IN_FLIGHT``: hold a request on the server, which fills the pool."""
        server.hold = True
        blocker = self.send_async("critical", "blocker")
        until(lambda: len(server.requests) == 1, "the blocker to reach the server")
        return blocker

    def saturate(self, server: FakeModelServer) -> None:
        """Make the server report a queue, and wait until the EPP has scraped it."""
        server.waiting = 3
        until(lambda: [ep["waiting"] for ep in self.debug_pool()["endpoints"]] == [3],
              "the EPP to see the saturated pool")

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.epp.metrics}/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line
                                                   for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        self.pool.shutdown(cancel_futures=True)
        self.envoy.stop()
        self.epp.stop()


def until(cond: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def server(bg: BackgroundLoop) -> Iterator[FakeModelServer]:
    [s] = start_servers(bg, 1)
    yield s
    s.released = 1 << 30  # a failed test must not leave requests held
    bg.run(s.stop())


@pytest.fixture
def gw(bg: BackgroundLoop, tmp_path: Path, server: FakeModelServer,
       request: pytest.FixtureRequest) -> Iterator[Gateway]:
    g = Gateway(bg, tmp_path, server, **getattr(request, "param", {}))
    yield g
    g.stop()


def release_in_turn(server: FakeModelServer, futures: list[Future[httpx.Response]],
                    blocker: Future[httpx.Response]) -> list[str]:
    """End the held requests one at a time (each end frees the one place); the prompts in the
    order they reached the server after the blocker."""
    for i in range(1, len(futures) + 1):
        server.released += 1
        until(lambda i=i: len(server.requests) >= i + 1, f"request {i} to reach the server")
        assert len(server.requests) == i + 1  # one place, one request
    server.released += 1
    assert [f.result().status_code for f in [blocker, *futures]] == [200] * (len(futures) + 1)
    return [r["body"]["prompt"] for r in server.requests[1:]]


@pytest.mark.parametrize("gw", [{"detector": ONE_IN_FLIGHT}], indirect=True)
def test_queued_requests_complete_in_band_order(gw: Gateway, server: FakeModelServer) -> None:
    blocker = gw.fill(server)
    futures = []
    for objective, tag in (("batch", "low"), ("standard", "mid"), ("critical", "high")):
        n = gw.debug()["queued"]
        futures.append(gw.send_async(objective, tag))
        until(lambda n=n: gw.debug()["queued"] == n + 1, f"{tag} to be queued")
    assert len(server.requests) == 1  # everything waits in the EPP
    assert release_in_turn(server, futures, blocker) == ["high", "mid", "low"]


def test_full_band_answers_429_with_retry_after(gw: Gateway, server: FakeModelServer) -> None:
    gw.saturate(server)
    waiting = [gw.send_async("standard", f"q{i}") for i in range(2)]
    until(lambda: gw.debug()["queued"] == 2, "two queued")
    r = gw.send("standard", "one too many")
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "flow_control_queue_full"
    assert r.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    server.waiting = 0
    assert [f.result().status_code for f in waiting] == [200, 200]


@pytest.mark.parametrize("gw", [{"ttl": "300ms"}], indirect=True)
def test_ttl_expiry_answers_429_with_retry_after(gw: Gateway, server: FakeModelServer) -> None:
    """v0.10: the pool has endpoints, so an expired wait is backpressure (429), not 503."""
    gw.saturate(server)
    r = gw.send("standard", "too patient")
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "flow_control_ttl_expired"
    assert r.headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
    assert int(r.headers["retry-after"]) >= 1
    assert gw.debug()["queued"] == 0
    assert server.requests == []


def test_client_disconnect_frees_its_place(gw: Gateway, server: FakeModelServer) -> None:
    gw.saturate(server)
    gone = gw.send_async("standard", "impatient", timeout=1.0)
    stays = gw.send_async("standard", "stays")
    until(lambda: gw.debug()["queued"] == 2, "two queued")
    with pytest.raises(httpx.TimeoutException):
        gone.result()
    until(lambda: gw.debug()["queued"] == 1, "the gone client's request to leave the queue")
    assert gw.metric("inference_extension_flow_control_request_queue_duration_seconds_count",
                     outcome="EvictedContextCancelled") == 1
    # Its place is free: another request queues instead of getting 429.
    third = gw.send_async("standard", "third")
    until(lambda: gw.debug()["queued"] == 2, "the third request queued")
    server.waiting = 0
    assert stays.result().status_code == 200 and third.result().status_code == 200
    assert "impatient" not in [r["body"]["prompt"] for r in server.requests]


@pytest.mark.parametrize("gw", [{"detector": ONE_IN_FLIGHT}], indirect=True)
def test_tenants_of_a_round_robin_band_take_turns(gw: Gateway,
                                                  server: FakeModelServer) -> None:
    blocker = gw.fill(server)
    futures = []
    for tenant, tag in (("noisy", "n0"), ("noisy", "n1"), ("noisy", "n2"), ("quiet", "q0")):
        n = gw.debug()["queued"]
        futures.append(gw.send_async("critical", tag, tenant=tenant))
        until(lambda n=n: gw.debug()["queued"] == n + 1, f"{tag} queued")
    assert release_in_turn(server, futures, blocker) == ["n0", "q0", "n1", "n2"]


def test_epp_shutdown_answers_queued_requests_with_503(gw: Gateway,
                                                       server: FakeModelServer) -> None:
    gw.saturate(server)
    queued = gw.send_async("standard", "queued at shutdown")
    until(lambda: gw.debug()["queued"] == 1, "queued")
    gw.epp.proc.terminate()  # SIGTERM: the EPP drains
    r = queued.result()
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "flow_control_unavailable"
    assert r.headers["x-llm-d-request-dropped-reason"] == "rejected-shutting-down"
    assert int(r.headers["retry-after"]) >= 1
    assert server.requests == []


EMPTY_POOL = """\
featureGates: [flowControl]
flowControl:
  defaultRequestTTL: 30s
  noEndpointRequestTTL: %s
"""


@pytest.mark.parametrize("no_endpoint_ttl", ["0s", "300ms"])
def test_pool_without_endpoints_answers_503_no_endpoints(bg: BackgroundLoop, tmp_path: Path,
                                                         no_endpoint_ttl: str) -> None:
    """v0.10: no serving capacity at all is 503 ``rejected-no-endpoints`` (at once with
    ``noEndpointRequestTTL: 0s``, after that wait otherwise - not the 30 s TTL)."""
    manifests = tmp_path / "pool.yaml"
    write_yaml(manifests, pool_manifests("pool", [], 8000, OBJECTIVES))
    epp = EppProcess(manifests, "--config-text", EMPTY_POOL % no_endpoint_ttl,
                     log_path=tmp_path / "epp.log").wait_serving()
    admin, port = e.free_port(), e.free_port()
    envoy = e.Envoy(pool_gateway_config(epp.port, admin, port), admin_port=admin,
                    workdir=tmp_path / "envoy").start()
    try:
        started = time.monotonic()
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=20,
                       content=orjson.dumps({"model": "m", "prompt": "x", "max_tokens": 1}))
        assert time.monotonic() - started < 10
        assert r.status_code == 503, r.text
        assert r.headers.get("x-llm-d-request-dropped-reason") == "rejected-no-endpoints", \
            (r.headers, r.text)
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"]["code"] == "no_endpoints"
    finally:
        envoy.stop()
        epp.stop()


EVICTION = """\
featureGates: [flowControl]
plugins:
- {type: concurrency-detector, name: detector, parameters: {maxConcurrency: 1}}
flowControl:
  saturationDetector: {pluginRef: detector}
  enableEviction: %s
"""


@pytest.mark.parametrize("gw", [{"config": EVICTION % "true"}], indirect=True)
def test_eviction_ends_an_in_flight_sheddable_request_for_a_blocked_critical_one(
        gw: Gateway, server: FakeModelServer) -> None:
    """v0.10 ``enableEviction``: the pool is full with a sheddable request in flight; a
    critical one waits, so the sheddable one is ended (429 ``evicted``) and the critical one
    takes its place."""
    server.hold = True
    sheddable = gw.send_async("batch", "sheddable")
    until(lambda: len(server.requests) == 1, "the sheddable request to reach the server")
    critical = gw.send_async("critical", "critical")
    r = sheddable.result(timeout=20)
    assert r.status_code == 429
    assert r.headers["x-llm-d-request-dropped-reason"] == "evicted"
    assert r.json()["error"]["code"] == "flow_control_evicted"
    until(lambda: len(server.requests) == 2, "the critical request to reach the server")
    server.released = 1 << 30
    assert critical.result(timeout=20).status_code == 200
    assert gw.metric("llm_d_epp_flow_control_revocations_issued_total", priority="10") == 1


@pytest.mark.parametrize("gw", [{"config": EVICTION % "false"}], indirect=True)
def test_without_eviction_the_critical_request_waits_for_the_sheddable_one(
        gw: Gateway, server: FakeModelServer) -> None:
    server.hold = True
    sheddable = gw.send_async("batch", "sheddable")
    until(lambda: len(server.requests) == 1, "the sheddable request to reach the server")
    critical = gw.send_async("critical", "critical")
    until(lambda: gw.debug()["queued"] == 1, "the critical request to queue")
    time.sleep(0.5)
    assert not sheddable.done() and len(server.requests) == 1
    server.released = 1 << 30
    assert sheddable.result(timeout=20).status_code == 200
    assert critical.result(timeout=20).status_code == 200


BUDGET = """\
plugins:
- type: token-budget-admitter
  parameters: {tokensPerMinute: 1000000, tenants: {noisy: 10}}
"""


@pytest.mark.parametrize("gw", [{"config": BUDGET}], indirect=True)
def test_a_tenant_over_its_token_budget_gets_429_with_retry_after(
        gw: Gateway, server: FakeModelServer) -> None:
    """The server answers ``usage`` 7 + 3 = 10 tokens: the noisy tenant's one request uses
    its 10-token budget, its next is refused; another tenant goes on."""
    assert gw.send("standard", "first", tenant="noisy").status_code == 200
    r = gw.send("standard", "second", tenant="noisy")
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "token_budget_exceeded"
    assert r.headers["x-llm-d-request-dropped-reason"] == "rejected-token-budget"
    assert 1 <= int(r.headers["retry-after"]) <= 61
    assert gw.send("standard", "other", tenant="quiet").status_code == 200
    assert [q["body"]["prompt"] for q in server.requests] == ["first", "other"]


PROGRAM_AWARE = f"""\
featureGates: [flowControl]
plugins:
- {SCRAPED_QUEUE}
- {{type: program-aware-fairness, name: programs}}
saturationDetector: {{pluginRef: detector}}
flowControl:
  priorityBands:
  - {{priority: 10, fairnessPolicyRef: programs}}
"""


@pytest.mark.parametrize("gw", [{"config": PROGRAM_AWARE}], indirect=True)
def test_program_aware_and_stale_endpoint_series_are_scraped_from_the_epp(
        gw: Gateway, server: FakeModelServer) -> None:
    """Issue 27's leftover v0.10 series on the running ``epp``'s ``/metrics``: the programs
    that waited get their mean wait and attained service, Jain's index spans them, and the
    utilization detector's stale count is 0 while scrapes work, 1 once they fail."""
    gw.saturate(server)
    futures = []
    for program in ("agent-a", "agent-b"):
        n = gw.debug()["queued"]
        futures.append(gw.send_async("critical", program, tenant=program))
        until(lambda n=n: gw.debug()["queued"] == n + 1, f"{program} queued")
    time.sleep(0.2)  # both wait at least this long
    server.waiting = 0
    assert [f.result(timeout=20).status_code for f in futures] == [200, 200]
    for program in ("agent-a", "agent-b"):
        assert gw.metric("llm_d_epp_program_aware_avg_wait_time_milliseconds",
                         program_id=program) >= 200
        # the server's usage: 7 prompt + 2 x 3 completion tokens
        assert gw.metric("llm_d_epp_program_aware_attained_service_tokens",
                         program_id=program) == pytest.approx(13, rel=0.01)
    assert 0.5 <= gw.metric("llm_d_epp_program_aware_jains_fairness_index") <= 1.0
    assert gw.metric("llm_d_epp_flow_control_stale_endpoints", detector="detector") == 0
    server.metrics_status = 500  # scrapes fail: the endpoint's metrics go stale ...
    time.sleep(0.5)
    stalled = gw.send_async("critical", "stalled", tenant="agent-a")  # ... and read as full
    until(lambda: gw.metric("llm_d_epp_flow_control_stale_endpoints",
                            detector="detector") == 1, "the stale endpoint to be counted")
    assert not stalled.done()
    server.metrics_status = 200
    assert stalled.result(timeout=20).status_code == 200
