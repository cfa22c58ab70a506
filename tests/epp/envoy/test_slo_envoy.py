"""SLO headers and latency measurement through the real Envoy and the real ``epp`` running
upstream v1.5's predicted-latency plugin set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.epp.unit.test_slo import LATENCY_CONFIG
from tests.support.epp_gateway import EppGateway
from tests.support.picker import start_servers
from tests.support.processes import BackgroundLoop, FakeModelServer

pytestmark = pytest.mark.envoy


@pytest.fixture
def servers(bg: BackgroundLoop) -> Iterator[list[FakeModelServer]]:
    started = start_servers(bg, 2)
    yield started
    for s in started:
        bg.run(s.stop())


def post(gw: EppGateway, headers: dict[str, str], stream: bool = False) -> httpx.Response:
    body = orjson.dumps({"model": "base-model", "prompt": "hi", "max_tokens": 3,
                         "stream": stream})
    return httpx.post(f"http://127.0.0.1:{gw.port}/v1/completions", content=body,
                      headers=headers, timeout=10)


def samples(gw: EppGateway, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{gw.epp.metrics}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)


def test_slo_headers_bad_values_get_a_400_and_good_ones_route(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    gw = EppGateway(bg, tmp_path, servers, "--config-text", LATENCY_CONFIG)
    try:
        bad = post(gw, {"x-slo-ttft-ms": "fast"})
        negative = post(gw, {"x-slo-tpot-ms": "-1"})
        good = post(gw, {"x-slo-ttft-ms": "200", "x-slo-tpot-ms": "50"})
        none = post(gw, {})
        streamed = post(gw, {"x-slo-ttft-ms": "200"}, stream=True)
        ttft_count = samples(gw, "inference_objective_request_ttft_seconds_count")
        tpot_count = samples(gw, "inference_objective_request_tpot_seconds_count")
    finally:
        gw.stop()
    for r in (bad, negative):
        assert r.status_code == 400
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"]["code"] == "invalid_slo_header"
    assert "x-slo-ttft-ms" in bad.json()["error"]["message"]
    assert good.status_code == none.status_code == streamed.status_code == 200
    assert b"data:" in streamed.content
    assert ttft_count == 3 and tpot_count == 3  # good, none (not streamed) and streamed
