"""``requestHandler.parsers`` (llm-d v0.10) through a real Envoy: the request's path picks
the parser; a path no listed parser claims, with no fallback parser, is answered 404 with an
OpenAI-style body, and with ``passthrough-parser`` listed last it is routed unread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from tests.support.picker import start_servers
from tests.support.processes import (
    BackgroundLoop,
    EppProcess,
    FakeModelServer,
    pool_gateway_config,
)

pytestmark = pytest.mark.envoy


def config(fallback: bool) -> str:
    last = "\n  - pluginRef: raw" if fallback else ""
    return f"""\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {{name: grpc, type: vllmgrpc-parser}}
- {{name: openai, type: openai-parser}}
- {{name: raw, type: passthrough-parser}}
- {{type: queue-scorer}}
requestHandler:
  parsers:
  - pluginRef: grpc
  - pluginRef: openai{last}
"""


@pytest.fixture
def servers(bg: BackgroundLoop) -> Iterator[list[FakeModelServer]]:
    s = start_servers(bg, 2)
    yield s
    for server in s:
        bg.run(server.stop())


@pytest.mark.parametrize("fallback", [False, True], ids=["no-fallback", "passthrough-last"])
def test_the_path_picks_the_parser(bg: BackgroundLoop, tmp_path: Path,
                                   servers: list[FakeModelServer], fallback: bool) -> None:
    manifests = tmp_path / "pool.yaml"
    write_yaml(manifests, pool_manifests("pool", [(s.name, s.host) for s in servers],
                                         servers[0].port))
    epp = EppProcess(manifests, "--config-text", config(fallback),
                     log_path=tmp_path / "epp.log").wait_serving()
    admin, listen = e.free_port(), e.free_port()
    envoy = e.Envoy(pool_gateway_config(epp.port, admin, listen), admin_port=admin,
                    workdir=tmp_path / "envoy").start()
    url = f"http://127.0.0.1:{listen}"
    try:
        ok = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "hi"}, timeout=10)
        assert ok.status_code == 200
        assert ok.json()["seen_headers"]["x-gateway-destination-endpoint"] in {
            s.key for s in servers}
        bad = httpx.post(url + "/v1/completions", content=b"not json", timeout=10)
        assert bad.status_code == 400  # openai-parser claimed it and read it
        other = httpx.post(url + "/v1/custom/api", json={"model": "m", "prompt": "x"},
                           timeout=10)
        if fallback:
            assert other.status_code == 200  # passthrough: routed to a server, body unread
            assert other.headers["x-inference-pod"] in {s.name for s in servers}
        else:
            assert other.status_code == 404
            assert other.headers["content-type"] == "application/json"
            assert "no parser is configured for path '/v1/custom/api'" in (
                other.json()["error"]["message"])
    finally:
        envoy.stop()
        epp.stop()
