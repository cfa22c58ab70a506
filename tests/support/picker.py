"""A real Envoy → real ``epp`` process → small real model servers whose metrics tests set."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer, pool_gateway_config

REWRITE = {
    "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModelRewrite",
    "metadata": {"name": "food-review-split", "namespace": "default"},
    "spec": {"poolRef": {"name": "pool"}, "rules": [{
        "matches": [{"model": {"type": "Exact", "value": "food-review"}}],
        "targets": [{"modelRewrite": "food-review-v1", "weight": 70},
                    {"modelRewrite": "food-review-v2", "weight": 30}]}]},
}
OBJECTIVES = [
    {"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
     "metadata": {"name": name, "namespace": "default"},
     "spec": {"priority": priority, "poolRef": {"name": "pool"}}}
    for name, priority in (("batch", -1), ("chat", 1))
]
CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: lora-affinity-scorer
    weight: 2
"""


@dataclass
class Pool:
    servers: list[FakeModelServer]
    epp: EppProcess
    envoy: e.Envoy
    port: int
    manifests: Path
    docs: list[dict[str, Any]]

    def url(self, path: str = "/v1/completions") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def by_key(self, key: str) -> FakeModelServer:
        return next(s for s in self.servers if s.key == key)


def start_servers(bg: BackgroundLoop, n: int) -> list[FakeModelServer]:
    """``n`` servers on 127.0.1.1..n, all on one port (distinct pods, like a real pool)."""
    port = e.free_port()
    return [bg.run(FakeModelServer(f"pod-{i}", f"127.0.1.{i + 1}", port).start())
            for i in range(n)]


def start_pool(bg: BackgroundLoop, tmp: Path, servers: list[FakeModelServer], *epp_args: str,
               extra: list[dict[str, Any]] | None = None, mode: str = "FULL_DUPLEX_STREAMED",
               gateway_knows: list[FakeModelServer] | None = None) -> Pool:
    """The EPP and Envoy over ``servers``; Envoy's pool cluster lists ``gateway_knows``
    (default: ``servers``), the pods a Gateway would know from the InferencePool."""
    docs = pool_manifests("pool", [(s.name, s.host) for s in servers], servers[0].port,
                          extra if extra is not None else [REWRITE, *OBJECTIVES])
    manifests = tmp / "pool.yaml"
    write_yaml(manifests, docs)
    epp = EppProcess(manifests, "--config-text", CONFIG, *epp_args,
                     log_path=tmp / "epp.log").wait_serving()
    admin, listen = e.free_port(), e.free_port()
    known = [s.key for s in (gateway_knows or servers)]
    envoy = e.Envoy(pool_gateway_config(epp.port, admin, listen, mode=mode, endpoints=known),
                    admin_port=admin,
                    workdir=tmp / "envoy").start()
    return Pool(servers, epp, envoy, listen, manifests, docs)


@pytest.fixture(scope="module")
def pool(bg: BackgroundLoop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    servers = start_servers(bg, 3)
    p = start_pool(bg, tmp_path_factory.mktemp("pool"), servers)
    yield p
    p.envoy.stop()
    p.epp.stop()
    for s in servers:
        bg.run(s.stop())


@pytest.fixture(autouse=True)
def idle_servers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test starts (and leaves) the shared servers idle and healthy."""
    yield
    if "pool" in request.fixturenames:
        p: Pool = request.getfixturevalue("pool")
        for s in p.servers:
            s.waiting = s.running = 0
            s.kv = 0.0
            s.running_loras, s.waiting_loras = [], []
            s.metrics_status = 200
