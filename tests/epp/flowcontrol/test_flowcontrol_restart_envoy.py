"""An EPP restart while requests wait in its flow-control queues, through a real Envoy.

The pool's failure mode is configured twice, as a Gateway does: ``failureMode`` on the
InferencePool (which the EPP reads) and ``failure_mode_allow`` on Envoy's ext_proc filter.
FailClose: queued requests fail cleanly — an OpenAI-style 503 on a graceful stop (SIGTERM), a
prompt 5xx from Envoy when the EPP dies (SIGKILL). FailOpen: queued requests pass to the pool
— released at once on a graceful stop, and on a crash Envoy passes the request (BUFFERED
mode) to the pool without a pick. Either way the restarted EPP serves again.
"""

from __future__ import annotations

import signal
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
from devkit.topology import Pool, Topology
from tests.support.picker import start_servers
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer

pytestmark = pytest.mark.envoy

# One waiting request on the server saturates the pool (queue / 1 >= 1).
CONFIG = """\
featureGates: [flowControl]
plugins:
- type: utilization-detector
  parameters: {queueDepthThreshold: 1}
saturationDetector: {pluginRef: utilization-detector}
flowControl: {defaultRequestTTL: 60s}
"""


def until(cond: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class RestartGateway:
    """Envoy (BUFFERED, so a FailOpen filter can pass a body on) → EPP → one server."""

    def __init__(self, tmp: Path, server: FakeModelServer, failure_mode: str) -> None:
        self.tmp = tmp
        self.server = server
        docs = pool_manifests("pool", [(server.name, server.host)], server.port)
        docs[0]["spec"]["endpointPickerRef"]["failureMode"] = failure_mode
        self.manifests = tmp / "pool.yaml"
        write_yaml(self.manifests, docs)
        self.epp = self._start_epp()
        admin, self.port = e.free_port(), e.free_port()
        topo = Topology(listen=self.port, admin=admin, mode="BUFFERED",
                        failure_mode_allow=failure_mode == "FailOpen",
                        pools=[Pool("pool", cluster="pool", epp_cluster="epp",
                                    epp_port=self.epp.port,
                                    endpoints=[(server.host, server.port)])])
        self.envoy = e.Envoy(topo.bootstrap(), admin_port=admin, workdir=tmp / "envoy").start()
        self.pool = ThreadPoolExecutor(4)

    def _start_epp(self, grpc_port: int | None = None) -> EppProcess:
        extra = ("--grpc-port", str(grpc_port)) if grpc_port else ()
        epp = EppProcess(self.manifests, "--config-text", CONFIG,
                         "--refresh-metrics-interval", "20ms", *extra,
                         log_path=self.tmp / f"epp-{time.monotonic_ns()}.log")
        if grpc_port:
            epp.port = grpc_port
        return epp.wait_serving()

    def restart(self, sig: signal.Signals) -> None:
        """Stop the EPP with ``sig`` and start a new one on the same gRPC port."""
        self.epp.proc.send_signal(sig)
        self.epp.proc.wait(15)
        self.epp.stop()
        self.epp = self._start_epp(self.epp.port)

    def send(self, tag: str) -> httpx.Response:
        body = orjson.dumps({"model": "base-model", "prompt": tag, "max_tokens": 1})
        return httpx.post(f"http://127.0.0.1:{self.port}/v1/completions", content=body,
                          timeout=30)

    def send_async(self, tag: str) -> Future[httpx.Response]:
        return self.pool.submit(self.send, tag)

    def debug_pool(self) -> dict[str, Any]:
        r = httpx.get(f"http://127.0.0.1:{self.epp.metrics}/debug/pool", timeout=5)
        body: dict[str, Any] = r.json()
        return body

    def queue_one(self, tag: str) -> Future[httpx.Response]:
        """Saturate the pool (as scraped by the EPP) and leave one request waiting in it."""
        self.server.waiting = 3
        until(lambda: [ep["waiting"] for ep in self.debug_pool()["endpoints"]] == [3],
              "the EPP to see the saturated pool")
        queued = self.send_async(tag)
        until(lambda: self.debug_pool()["flowControl"]["queued"] == 1, f"{tag} queued")
        assert self.server.requests == []
        return queued

    def serves_again(self) -> None:
        """The restarted EPP picks for new requests once the pool has room."""
        self.server.waiting = 0
        until(lambda: [ep["waiting"] for ep in self.debug_pool()["endpoints"]] == [0],
              "the new EPP to scrape the pool")
        r = self.send("after restart")
        assert r.status_code == 200
        assert self.server.requests[-1]["body"]["prompt"] == "after restart"
        # the pick came from the EPP: it set the destination header
        assert "x-gateway-destination-endpoint" in self.server.requests[-1]["headers"]

    def stop(self) -> None:
        self.pool.shutdown(cancel_futures=True)
        self.envoy.stop()
        self.epp.stop()


@pytest.fixture
def server(bg: BackgroundLoop) -> Iterator[FakeModelServer]:
    [s] = start_servers(bg, 1)
    yield s
    bg.run(s.stop())


@pytest.fixture
def gw(tmp_path: Path, server: FakeModelServer,
       request: pytest.FixtureRequest) -> Iterator[RestartGateway]:
    g = RestartGateway(tmp_path, server, request.param)
    yield g
    g.stop()


@pytest.mark.parametrize("gw", ["FailClose"], indirect=True)
def test_fail_close_graceful_restart_answers_queued_requests_503(gw: RestartGateway) -> None:
    queued = gw.queue_one("queued at restart")
    gw.restart(signal.SIGTERM)
    r = queued.result()
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "flow_control_unavailable"
    assert int(r.headers["retry-after"]) >= 1
    assert gw.server.requests == []
    gw.serves_again()


@pytest.mark.parametrize("gw", ["FailOpen"], indirect=True)
def test_fail_open_graceful_restart_passes_queued_requests_to_the_pool(
        gw: RestartGateway) -> None:
    queued = gw.queue_one("queued at restart")
    gw.restart(signal.SIGTERM)
    r = queued.result()
    assert r.status_code == 200
    assert [q["body"]["prompt"] for q in gw.server.requests] == ["queued at restart"]
    # released by the draining EPP, so it still carries the EPP's pick
    assert gw.server.requests[0]["headers"]["x-gateway-destination-endpoint"] == gw.server.key
    gw.serves_again()


@pytest.mark.parametrize("gw", ["FailClose"], indirect=True)
def test_fail_close_crash_fails_queued_requests_with_a_5xx(gw: RestartGateway) -> None:
    queued = gw.queue_one("queued at crash")
    gw.restart(signal.SIGKILL)
    r = queued.result()  # answered, not left hanging
    assert 500 <= r.status_code < 600
    assert gw.server.requests == []
    gw.serves_again()


@pytest.mark.parametrize("gw", ["FailOpen"], indirect=True)
def test_fail_open_crash_passes_queued_requests_to_the_pool(gw: RestartGateway) -> None:
    queued = gw.queue_one("queued at crash")
    gw.restart(signal.SIGKILL)
    r = queued.result()
    assert r.status_code == 200
    assert [q["body"]["prompt"] for q in gw.server.requests] == ["queued at crash"]
    # Envoy passed it on without a pick (its fallback balancing chose the server)
    assert "x-gateway-destination-endpoint" not in gw.server.requests[0]["headers"]
    gw.serves_again()
