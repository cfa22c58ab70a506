"""The real-vLLM harness's gateway (``tests/vllm/harness.py``) in ``make test``, in front of two
simulators where ``make test-vllm`` puts real vLLM servers.

``make test-vllm`` is opt-in, so a drift between the harness and devkit's Envoy builder shows
here first: once Envoy's pool became an ``override_host`` cluster of the pool's endpoints, the
harness gave it the simulated fleet's addresses instead of the real servers', and every
request through the gateway got 503 until the real-vLLM module next ran.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devkit import envoy as e
from devkit.net import wait_for_port
from tests.vllm.harness import (
    EPP_CONFIG,
    FLOW_CONTROL_CONFIG,
    MODEL,
    Gateway,
    PDPool,
    VllmServer,
    debug_pool,
)

pytestmark = pytest.mark.envoy


@pytest.fixture
def servers() -> Iterator[list[VllmServer]]:
    """Two simulators on one port (127.0.19.1 and .2, the addresses the real servers use)."""
    port = e.free_port()
    servers = [VllmServer("a", "127.0.19.1", port), VllmServer("b", "127.0.19.2", port)]
    procs = [subprocess.Popen([sys.executable, "-m", "sim.main", "--host", s.host,
                               "--port", str(port), "--served-model-name", MODEL,
                               "--profile", "tiny", "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for s in servers]
    try:
        for s in servers:
            wait_for_port(port, timeout=30, host=s.host)
        yield servers
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


@pytest.mark.parametrize("config", [EPP_CONFIG, FLOW_CONTROL_CONFIG],
                         ids=["default", "flow-control"])
def test_harness_gateway_routes_to_its_servers(tmp_path: Path, servers: list[VllmServer],
                                               config: str) -> None:
    gw = Gateway(tmp_path, servers, MODEL, [], epp_config=config)
    try:
        gw.start()
        deadline = time.monotonic() + 60
        while not all(ep["healthy"] and ep["age_seconds"] is not None
                      for ep in debug_pool(gw).values()):  # scraped once: ready to pick
            assert time.monotonic() < deadline, debug_pool(gw)
            time.sleep(0.1)
        assert set(debug_pool(gw)) == {s.key for s in servers}
        for model in (MODEL, "alias"):
            r = httpx.post(gw.url + "/v1/completions", timeout=60,
                           json={"model": model, "prompt": "hello", "max_tokens": 2})
            assert r.status_code == 200, f"{r.status_code} {r.text}"
            assert r.json()["model"] == model
        fc = httpx.get(f"http://127.0.0.1:{gw.ports['epp_metrics']}/debug/pool",
                       timeout=10).json().get("flowControl")
        assert (fc is not None) == (config is FLOW_CONTROL_CONFIG)
    finally:
        gw.stop()


def test_harness_pd_gateway_disaggregates_through_the_sidecar(tmp_path: Path) -> None:
    """The P/D check's wiring (pod roles, llm-d's P/D profile, the sidecar on the decode pod's
    port in ``shared-storage`` mode) in front of two simulators: a long prompt is prefilled
    on the prefiller (one token) and decoded behind the sidecar."""
    pd = PDPool.local(tmp_path, MODEL)
    procs = [subprocess.Popen([sys.executable, "-m", "sim.main", "--host", s.host,
                               "--port", str(s.port), "--served-model-name", MODEL,
                               "--profile", "tiny", "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for s in (pd.prefiller, pd.decoder)]
    try:
        for s in (pd.prefiller, pd.decoder):
            wait_for_port(s.port, timeout=30, host=s.host)
        pd.start_gateway()
        assert pd.gateway is not None
        deadline = time.monotonic() + 60
        while not all(ep["healthy"] and ep["age_seconds"] is not None
                      for ep in debug_pool(pd.gateway).values()):
            assert time.monotonic() < deadline, debug_pool(pd.gateway)
            time.sleep(0.1)
        assert set(debug_pool(pd.gateway)) == {pd.prefiller.key, pd.decode_pod.key}
        r = httpx.post(pd.gateway.url + "/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": "long " * 200, "max_tokens": 3})
        assert r.status_code == 200, f"{r.status_code} {r.text}"
        assert r.headers["x-inference-port"] == str(pd.decoder.port)  # the decoder answered
        assert r.json()["usage"]["completion_tokens"] == 3
        side = pd.sidecar_metrics()
        assert 'pd_sidecar_requests_total{mode="disaggregated"} 1.0' in side, side
        prefill = pd.prefiller.get("/metrics")
        assert any(line.startswith("vllm:generation_tokens_total{") and line.endswith(" 1.0")
                   for line in prefill.splitlines()), "the prefill leg's one token"
    finally:
        pd.stop_gateway()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
