"""Session affinity through the real Envoy and the real ``epp``: the token a response
carries brings the next turn back to the same server; forged tokens (and a client's own
destination header) stay inside the pool; a bad key file stops the EPP with one line."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.epp_gateway import EppGateway
from tests.support.processes import BackgroundLoop, FakeModelServer

pytestmark = pytest.mark.envoy

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-affinity-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: session-affinity-scorer, weight: 10}
  - {pluginRef: queue-scorer, weight: 1}
"""


def send(gw: EppGateway, headers: dict[str, str]) -> httpx.Response:
    body = orjson.dumps({"model": "base-model", "prompt": "turn", "max_tokens": 1})
    r = httpx.post(f"http://127.0.0.1:{gw.port}/v1/completions", content=body,
                   headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r


def test_a_session_token_brings_every_turn_back_to_the_server_that_served_the_first(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    key = tmp_path / "session.key"
    key.write_text("a-secret-of-at-least-16-bytes\n")
    gw = EppGateway(bg, tmp_path, servers, "--config-text", CONFIG,
                 "--session-token-key-file", str(key), "--allow-experimental-plugins")
    try:
        first = send(gw, {})
        token = first.headers["x-session-token"]
        pod = first.json()["served_by"]
        turns = Counter(send(gw, {"x-session-token": token}).json()["served_by"]
                        for _ in range(8))
        without = Counter(send(gw, {}).json()["served_by"] for _ in range(8))
    finally:
        gw.stop()
    assert turns == {pod: 8}
    assert len(without) > 1  # the same requests without the token are spread


def test_forged_tokens_and_client_destinations_stay_in_the_pool(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    gw = EppGateway(bg, tmp_path, servers, "--config-text", CONFIG,
                 "--allow-experimental-plugins")  # the scorer is Alpha upstream
    names = {s.name for s in servers}
    llm_d_style = base64.b64encode(b"default/pod-0-rank-0").decode()
    forged = [{"x-session-token": "A" * 32}, {"x-session-token": llm_d_style},
              {"x-session-token": "not a token", "x-gateway-destination-endpoint": "127.0.0.1:1"},
              {"x-session-token": "B" * 32, "x-gateway-destination-endpoint-served": "1.2.3.4:80"}]
    try:
        served = [send(gw, h).json()["served_by"] for h in forged]
    finally:
        gw.stop()
    assert set(served) <= names


def test_an_unreadable_or_short_key_file_stops_the_epp_with_one_line(tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("tiny")
    for path, reason in ((tmp_path / "missing.key", "cannot read"), (short, "at least 16")):
        out = subprocess.run(
            [sys.executable, "-m", "epp.main", "--manifests", str(tmp_path),
             "--secure-serving=false", "--session-token-key-file", str(path)],
            capture_output=True, text=True, timeout=30)
        assert out.returncode == 1
        line = out.stderr.strip().splitlines()[-1]
        assert "--session-token-key-file" in line and reason in line and str(path) in line
