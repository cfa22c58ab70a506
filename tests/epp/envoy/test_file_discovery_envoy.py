"""``dataLayer.discovery`` with ``file-discovery`` (llm-d v0.10): the real ``epp`` runs from a
file of endpoints, with neither the Kubernetes API nor ``--manifests``, behind a real Envoy;
with ``watchFile`` an edit of the file moves traffic."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import yaml

from devkit import envoy as e
from tests.support.picker import start_servers
from tests.support.processes import (
    BackgroundLoop,
    EppProcess,
    FakeModelServer,
    pool_gateway_config,
)

pytestmark = pytest.mark.envoy


def config(path: Path) -> str:
    return f"""\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: endpoints
  type: file-discovery
  parameters: {{path: {path}, watchFile: true}}
- type: queue-scorer
dataLayer:
  discovery: {{pluginRef: endpoints}}
"""


def write(path: Path, servers: list[FakeModelServer]) -> None:
    path.write_text(yaml.safe_dump({"endpoints": [
        {"name": s.name, "address": s.host, "port": str(s.port)} for s in servers]}))


@pytest.fixture
def servers(bg: BackgroundLoop) -> Iterator[list[FakeModelServer]]:
    s = start_servers(bg, 3)
    yield s
    for server in s:
        bg.run(server.stop())


def served(port: int, n: int) -> set[str]:
    out = set()
    for _ in range(n):
        body = {"model": "base-model", "prompt": f"unique {uuid.uuid4()}"}
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", content=orjson.dumps(body),
                       timeout=10)
        assert r.status_code == 200, r.text
        out.add(r.json()["seen_headers"]["x-gateway-destination-endpoint"])
    return out


def test_the_epp_serves_the_endpoints_a_file_lists_and_follows_its_edits(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    write(endpoints, servers)
    epp = EppProcess(None, "--config-text", config(endpoints),
                     log_path=tmp_path / "epp.log").wait_serving()
    admin, listen = e.free_port(), e.free_port()
    envoy = e.Envoy(pool_gateway_config(epp.port, admin, listen), admin_port=admin,
                    workdir=tmp_path / "envoy").start()
    try:
        assert served(listen, 30) == {s.key for s in servers}
        write(endpoints, servers[:1])  # two endpoints leave the file
        deadline = time.monotonic() + 10
        while served(listen, 5) != {servers[0].key}:
            assert time.monotonic() < deadline, epp.log_tail()
            time.sleep(0.2)
        assert served(listen, 20) == {servers[0].key}
    finally:
        envoy.stop()
        epp.stop()


def test_an_unreadable_endpoints_file_stops_the_start_with_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    missing = tmp_path / "nope.yaml"
    r = subprocess.run([sys.executable, "-m", "epp.main", "--secure-serving=false",
                        "--config-text", config(missing)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert "endpoints (file-discovery)" in line and str(missing) in line and "cannot read" in line
