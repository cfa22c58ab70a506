"""Fallback endpoints through a real Envoy: with ``maxNumOfEndpoints`` > 1 the EPP sends
``ip:port,ip:port`` and Envoy's ``override_host`` cluster tries them in order.

Three pods on one inference port; their vLLM metrics are served on a separate port
(``--model-server-metrics-port``), so a pod can look perfect to the EPP while nothing listens
on its inference port: a dead server the EPP has not noticed yet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer, pool_gateway_config

pytestmark = pytest.mark.envoy

HOSTS = ("127.0.4.1", "127.0.4.2", "127.0.4.3")
# The EPP ranks the pods by queue length: 127.0.4.1 first, then .2, then .3.
QUEUES = (0, 2, 9)


def config(max_endpoints: int) -> str:
    return f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
  parameters: {{maxNumOfEndpoints: {max_endpoints}}}
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: queue-scorer}}, {{pluginRef: max-score-picker}}]
"""


@dataclass
class Fleet:
    port: int
    metrics: list[FakeModelServer]
    inference: dict[str, FakeModelServer]

    def key(self, i: int) -> str:
        return f"{HOSTS[i]}:{self.port}"


@pytest.fixture
def fleet(bg: BackgroundLoop) -> Iterator[Fleet]:
    """Metrics for all three pods; inference servers on the 2nd and 3rd only (the 1st is dead)."""
    port, metrics_port = e.free_port(), e.free_port()
    metrics = []
    for i, host in enumerate(HOSTS):
        m = bg.run(FakeModelServer(f"metrics-{i}", host, metrics_port).start())
        m.waiting = QUEUES[i]
        metrics.append(m)
    inference = {HOSTS[i]: bg.run(FakeModelServer(f"pod-{i}", HOSTS[i], port).start())
                 for i in (1, 2)}
    f = Fleet(port, metrics, inference)
    yield f
    for s in [*metrics, *f.inference.values()]:
        bg.run(s.stop())


@dataclass
class Gateway:
    epp: EppProcess
    envoy: e.Envoy
    port: int

    def complete(self, i: int) -> httpx.Response:
        body = orjson.dumps({"model": "base-model", "prompt": f"hello {i}"})
        return httpx.post(f"http://127.0.0.1:{self.port}/v1/completions", content=body,
                          timeout=10)


def start_gateway(tmp: Path, fleet: Fleet, max_endpoints: int) -> Gateway:
    manifests = tmp / "pool.yaml"
    write_yaml(manifests, pool_manifests(
        "pool", [(f"pod-{i}", h) for i, h in enumerate(HOSTS)], fleet.port))
    epp = EppProcess(manifests, "--config-text", config(max_endpoints),
                     "--model-server-metrics-port", str(fleet.metrics[0].port),
                     log_path=tmp / "epp.log").wait_serving()
    admin, listen = e.free_port(), e.free_port()
    known = [fleet.key(i) for i in range(3)]
    envoy = e.Envoy(pool_gateway_config(epp.port, admin, listen, endpoints=known),
                    admin_port=admin, workdir=tmp / "envoy").start()
    return Gateway(epp, envoy, listen)


@pytest.fixture
def gateway(fleet: Fleet, tmp_path: Path) -> Iterator[Gateway]:
    g = start_gateway(tmp_path, fleet, max_endpoints=2)
    yield g
    g.envoy.stop()
    g.epp.stop()


def wait_ranked(g: Gateway) -> None:
    """Until the EPP has scraped every pod (its first picks would otherwise be unranked)."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pool = httpx.get(f"http://127.0.0.1:{g.epp.metrics}/debug/pool", timeout=5).json()
        waiting = sorted(ep["waiting"] for ep in pool["endpoints"] if ep["healthy"])
        if waiting == sorted(QUEUES):
            return
        time.sleep(0.05)
    raise AssertionError(f"EPP never scraped all pods: {pool}")


def test_first_endpoint_dead_request_served_by_the_next_in_the_list(
        gateway: Gateway, fleet: Fleet) -> None:
    wait_ranked(gateway)
    served: Counter[str] = Counter()
    for i in range(12):
        r = gateway.complete(i)
        assert r.status_code == 200, r.text
        seen = r.json()["seen_headers"]
        # The EPP sent its ranked list; Envoy tried the dead first and moved to the second.
        assert seen["x-lb-metadata"] == f"{fleet.key(0)},{fleet.key(1)}"
        assert r.headers["x-served-endpoint"] == fleet.key(1)
        served[r.json()["served_by"]] += 1
    # Never the third pod: the retry followed the EPP's list, not a load balancer.
    assert served == Counter({"pod-1": 12})


def test_primary_endpoint_used_while_alive(
        gateway: Gateway, fleet: Fleet, bg: BackgroundLoop) -> None:
    fleet.inference[HOSTS[0]] = bg.run(FakeModelServer("pod-0", HOSTS[0], fleet.port).start())
    wait_ranked(gateway)
    for i in range(12):
        r = gateway.complete(i)
        assert r.status_code == 200, r.text
        assert r.json()["served_by"] == "pod-0"
        assert r.headers["x-served-endpoint"] == fleet.key(0)
    assert not fleet.inference[HOSTS[1]].requests


def test_streaming_request_falls_back_too(gateway: Gateway, fleet: Fleet) -> None:
    wait_ranked(gateway)
    body = orjson.dumps({"model": "base-model", "prompt": "stream me", "stream": True})
    with httpx.stream("POST", f"http://127.0.0.1:{gateway.port}/v1/completions",
                      content=body, timeout=10) as r:
        text = r.read().decode()
    assert r.status_code == 200
    assert r.headers["x-inference-pod"] == "pod-1"
    assert text.rstrip().endswith("data: [DONE]")
