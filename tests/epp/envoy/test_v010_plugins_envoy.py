"""llm-d-router v0.10 plugin types end to end: real Envoy → real ``epp`` process (started with
the config) → small real model servers. One test per plugin kind at least (filter, scorer,
profile handler, producer, admitter, data source)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from tests.support.picker import start_servers
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer, pool_gateway_config

pytestmark = pytest.mark.envoy

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


class Gateway:
    """Envoy in front of one EPP started with ``config``; pod ``i`` gets ``labels[i]``."""

    def __init__(self, bg: BackgroundLoop, tmp: Path, servers: list[FakeModelServer],
                 config: str, labels: list[dict[str, str]] | None = None) -> None:
        docs = pool_manifests("pool", [(s.name, s.host) for s in servers], servers[0].port)
        for doc, extra in zip(docs[1:], labels or [], strict=False):
            doc["metadata"]["labels"].update(extra)
        manifests = tmp / "pool.yaml"
        write_yaml(manifests, docs)
        self.epp = EppProcess(manifests, "--config-text", HEAD + config,
                              log_path=tmp / "epp.log").wait_serving()
        admin, self.port = e.free_port(), e.free_port()
        self.envoy = e.Envoy(pool_gateway_config(self.epp.port, admin, self.port,
                                                 endpoints=[s.key for s in servers]),
                             admin_port=admin, workdir=tmp / "envoy").start()

    def complete(self, prompt: str, headers: dict[str, str] | None = None) -> httpx.Response:
        body = orjson.dumps({"model": "base-model", "prompt": prompt, "max_tokens": 1})
        return httpx.post(f"http://127.0.0.1:{self.port}/v1/completions", content=body,
                          headers=headers or {}, timeout=10)

    def served(self, n: int, headers: dict[str, str] | None = None) -> Counter[str]:
        out: Counter[str] = Counter()
        for i in range(n):
            r = self.complete(f"request {i} " * 8, headers)
            assert r.status_code == 200, r.text
            out[r.headers["x-inference-pod"]] += 1
        return out

    def wait_scraped(self, key: str, field: str, value: Any) -> None:
        deadline = time.monotonic() + 10
        while True:
            r = httpx.get(f"http://127.0.0.1:{self.epp.metrics}/debug/pool", timeout=5)
            eps = {ep["address"]: ep for ep in r.json()["endpoints"]}
            if eps[key][field] == value:
                return
            assert time.monotonic() < deadline, f"{key} never showed {field}={value}"
            time.sleep(0.05)

    def stop(self) -> None:
        self.envoy.stop()
        self.epp.stop()


@pytest.fixture
def servers(bg: BackgroundLoop) -> Iterator[list[FakeModelServer]]:
    started = start_servers(bg, 3)
    yield started
    for s in started:
        bg.run(s.stop())


def test_utilization_filter_keeps_requests_off_a_queued_server(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    busy = servers[0]
    busy.waiting = 3
    gw = Gateway(bg, tmp_path, servers, """\
plugins:
- type: utilization-filter
  parameters: {conditions: [{metric: waiting-queue, maxValue: 0}]}
- type: random-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: utilization-filter}, {pluginRef: random-picker}]
""")
    try:
        gw.wait_scraped(busy.key, "waiting", 3)
        served = gw.served(12)
    finally:
        gw.stop()
    # a random picker alone would send about a third of the requests to the busy server
    assert busy.name not in served and sum(served.values()) == 12


def test_header_label_affinity_scorer_sends_the_request_to_the_labelled_pod(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    gw = Gateway(bg, tmp_path, servers, """\
plugins:
- type: header-label-affinity-scorer
  parameters: {headerName: x-preferred-zone, labelKey: topology.kubernetes.io/zone}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: header-label-affinity-scorer}, {pluginRef: max-score-picker}]
""", labels=[{"topology.kubernetes.io/zone": z} for z in ("a", "b", "c")])
    try:
        to_b = gw.served(6, {"x-preferred-zone": "b"})
        to_c = gw.served(6, {"x-preferred-zone": "c"})
    finally:
        gw.stop()
    assert to_b == {"pod-1": 6} and to_c == {"pod-2": 6}


def test_header_profile_handler_runs_the_profile_the_header_names(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    gw = Gateway(bg, tmp_path, servers, """\
plugins:
- type: header-profile-handler
- {type: label-selector-filter, name: prefill-only, parameters: {matchLabels: {role: prefill}}}
- {type: label-selector-filter, name: decode-only, parameters: {matchLabels: {role: decode}}}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-only}]
- name: decode
  plugins: [{pluginRef: decode-only}]
""", labels=[{"role": "prefill"}, {"role": "decode"}, {"role": "decode"}])
    try:
        prefill = gw.served(4, {"EPP-Profile": "prefill"})
        default = gw.served(6)
        unknown = gw.complete("x", {"EPP-Profile": "encode"})
    finally:
        gw.stop()
    assert prefill == {"pod-0": 4}
    assert set(default) <= {"pod-1", "pod-2"} and sum(default.values()) == 6
    assert unknown.status_code == 429, unknown.text


def test_session_affinity_filter_pins_a_session_through_the_gateway(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    gw = Gateway(bg, tmp_path, servers, """\
plugins:
- type: session-affinity-filter
- type: random-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: session-affinity-filter}, {pluginRef: random-picker}]
""")
    try:
        first = gw.complete("hello")
        token = first.headers["x-session-token"]
        pinned = gw.served(8, {"x-session-token": token})
    finally:
        gw.stop()
    assert pinned == {first.headers["x-inference-pod"]: 8}
