"""``epp --pool-name`` against the fake API server serves traffic through a real Envoy
exactly as in manifests mode, and follows pod changes live."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devkit import envoy as e
from tests.support import k8s_objects as objects
from tests.support.fake_apiserver import FakeApiServer, kubeconfig
from tests.support.processes import BackgroundLoop, FakeModelServer, pool_gateway_config

pytestmark = [pytest.mark.envoy, pytest.mark.serial]


@pytest.fixture
def servers(bg: BackgroundLoop) -> Iterator[list[FakeModelServer]]:
    port = e.free_port()
    started = [bg.run(FakeModelServer(f"pod-{i}", f"127.0.3.{i + 1}", port).start())
               for i in range(3)]
    yield started
    for s in started:
        bg.run(s.stop())


def served(url: str, n: int) -> Counter[str]:
    out: Counter[str] = Counter()
    for i in range(n):
        r = httpx.post(url, json={"model": "base-model", "prompt": f"request {i}"}, timeout=10)
        assert r.status_code == 200, r.text
        out[r.json()["served_by"]] += 1
    return out


def test_epp_in_kubernetes_mode_routes_and_follows_pods(
        apiserver: FakeApiServer, servers: list[FakeModelServer], tmp_path: Path) -> None:
    port = servers[0].port
    apiserver.apply(objects.pool("pool-a", ports=(port,)))
    for s in servers[:2]:
        apiserver.apply(objects.pod(s.name, s.host))
    ports = {k: e.free_port() for k in ("grpc", "health", "metrics")}
    env = {**os.environ, "KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", apiserver)),
           "PYTHONUNBUFFERED": "1"}
    with (tmp_path / "epp.log").open("w") as log:
        epp = subprocess.Popen(
            [sys.executable, "-m", "epp.main", "--pool-name", "pool-a", "--pool-namespace",
             objects.NS, "--secure-serving=false", "--grpc-port", str(ports["grpc"]),
             "--grpc-health-port", str(ports["health"]), "--metrics-port", str(ports["metrics"])],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    admin, listen = e.free_port(), e.free_port()
    try:
        e.wait_for_port(ports["grpc"], timeout=20)
        gateway = pool_gateway_config(ports["grpc"], admin, listen,
                                      endpoints=[s.key for s in servers])
        with e.Envoy(gateway, admin_port=admin):
            url = f"http://127.0.0.1:{listen}/v1/completions"
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until the pool has synced
                if httpx.post(url, json={"model": "m", "prompt": "x"}).status_code == 200:
                    break
                time.sleep(0.1)
            assert set(served(url, 20)) == {"pod-0", "pod-1"}

            apiserver.apply(objects.pod("pod-2", servers[2].host))
            apiserver.delete("v1", "Pod", "pod-0", namespace=objects.NS)
            time.sleep(1.0)
            assert set(served(url, 20)) == {"pod-1", "pod-2"}
    finally:
        epp.terminate()
        epp.wait(10)
    assert epp.returncode == 0, (tmp_path / "epp.log").read_text()[-2000:]
