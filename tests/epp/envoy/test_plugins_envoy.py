"""Configs and plugins that must work end to end: real Envoy → real ``epp`` process → small
real model servers. Upstream v1.5.0's own chart config (with its data-layer plugins), and the
example third-party plugin package (examples/plugin-package, installed by ``make venv``)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import httpx
import orjson
import pytest

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from tests.support.picker import start_servers
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer, pool_gateway_config

pytestmark = pytest.mark.envoy

UPSTREAM_V15 = Path(__file__).parents[1] / "data" / "upstream-v1.5.0-default-plugins.yaml"
SPREAD_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: pick-counter
- type: fewest-picks-scorer
  parameters: {counter: pick-counter}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: fewest-picks-scorer}]
"""


class Gateway:
    """Envoy in front of one EPP started with ``config_args``."""

    def __init__(self, bg: BackgroundLoop, tmp: Path, servers: list[FakeModelServer],
                 *config_args: str) -> None:
        manifests = tmp / "pool.yaml"
        write_yaml(manifests, pool_manifests("pool", [(s.name, s.host) for s in servers],
                                             servers[0].port))
        self.epp = EppProcess(manifests, *config_args, log_path=tmp / "epp.log").wait_serving()
        admin, self.port = e.free_port(), e.free_port()
        self.envoy = e.Envoy(pool_gateway_config(self.epp.port, admin, self.port,
                                                 endpoints=[s.key for s in servers]),
                             admin_port=admin, workdir=tmp / "envoy").start()

    def complete(self, prompt: str) -> httpx.Response:
        body = orjson.dumps({"model": "base-model", "prompt": prompt, "max_tokens": 1})
        return httpx.post(f"http://127.0.0.1:{self.port}/v1/completions", content=body,
                          timeout=10)

    def debug_pool(self) -> dict[str, dict[str, object]]:
        r = httpx.get(f"http://127.0.0.1:{self.epp.metrics}/debug/pool", timeout=5)
        return {ep["address"]: ep for ep in r.json()["endpoints"]}

    def stop(self) -> None:
        self.envoy.stop()
        self.epp.stop()


@pytest.fixture
def servers(bg: BackgroundLoop) -> Iterator[list[FakeModelServer]]:
    started = start_servers(bg, 3)
    yield started
    for s in started:
        bg.run(s.stop())


def test_upstream_v15_chart_config_scrapes_through_its_data_layer_and_routes(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    busy = servers[0]
    busy.waiting = 50
    gw = Gateway(bg, tmp_path, servers, "--config-file", str(UPSTREAM_V15))
    try:
        deadline = time.monotonic() + 10
        while gw.debug_pool()[busy.key]["waiting"] != 50:
            assert time.monotonic() < deadline, "metrics-data-source never scraped the pool"
            time.sleep(0.05)
        served = Counter()
        for i in range(12):
            r = gw.complete(f"request {i} " * 20)
            assert r.status_code == 200, r.text
            served[r.json()["served_by"]] += 1
    finally:
        gw.stop()
    # queue-scorer (fed by the scraped queue) keeps every request off the busy server
    assert busy.name not in served and sum(served.values()) == 12


def test_example_plugin_package_schedules_real_requests(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    try:
        distribution("igw-example-plugins")
    except PackageNotFoundError:
        pytest.fail("examples/plugin-package is not installed: run `make venv`")
    gw = Gateway(bg, tmp_path, servers, "--config-text", SPREAD_CONFIG)
    try:
        served = Counter(gw.complete(f"p{i}").json()["served_by"] for i in range(6))
    finally:
        gw.stop()
    # fewest-picks-scorer reads pick-counter through the handle: a perfect spread
    assert served == {s.name: 2 for s in servers}
