"""Configs and plugins that must work end to end: real Envoy → real ``epp`` process → small
real model servers. Upstream v1.5.0's own chart config (with its data-layer plugins), and the
example third-party plugin package (examples/plugin-package, installed by ``make venv``)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import httpx
import pytest

from tests.support.epp_gateway import EppGateway
from tests.support.processes import BackgroundLoop, FakeModelServer

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


def test_upstream_v15_chart_config_scrapes_through_its_data_layer_and_routes(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    busy = servers[0]
    busy.waiting = 50
    gw = EppGateway(bg, tmp_path, servers, "--config-file", str(UPSTREAM_V15))
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
    gw = EppGateway(bg, tmp_path, servers, "--config-text", SPREAD_CONFIG)
    try:
        served = Counter(gw.complete(f"p{i}").json()["served_by"] for i in range(6))
    finally:
        gw.stop()
    # fewest-picks-scorer reads pick-counter through the handle: a perfect spread
    assert served == {s.name: 2 for s in servers}


def test_a_streamed_prompt_is_pending_prefill_until_its_first_token_through_envoy(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    """The default profile's ``prefill-load-scorer`` reads the pending prefill: the real
    exchange must release it at the first streamed token, not at the end of the stream."""
    for s in servers:
        s.hold, s.stream_delay = True, 1.5  # each server holds its first request
    gw = EppGateway(bg, tmp_path, servers)
    body = {"model": "base-model", "prompt": "a prompt to compute " * 30, "stream": True}
    done: list[int] = []

    def stream() -> None:
        with httpx.stream("POST", f"http://127.0.0.1:{gw.port}/v1/completions", json=body,
                          timeout=20) as r:
            r.read()
            done.append(r.status_code)

    client = threading.Thread(target=stream)
    try:
        client.start()
        deadline = time.monotonic() + 10
        while not any(ep["prefill_tokens"] > 0 for ep in gw.debug_pool().values()):
            assert time.monotonic() < deadline, "the pick never counted its prompt"
            time.sleep(0.05)
        (key,) = [k for k, ep in gw.debug_pool().items() if ep["prefill_tokens"] > 0]
        pending = gw.debug_pool()[key]["prefill_tokens"]
        for s in servers:
            s.released = 1  # the held request starts streaming
        gw.wait_scraped(key, "prefill_tokens", 0)
        # the first token came back; the rest of the stream is still on its way
        assert gw.debug_pool()[key]["inflight_tokens"] == pending
        client.join(20)
        assert done == [200]
        assert gw.debug_pool()[key]["inflight_tokens"] == 0
    finally:
        for s in servers:
            s.released = 1
        client.join(20)
        gw.stop()
