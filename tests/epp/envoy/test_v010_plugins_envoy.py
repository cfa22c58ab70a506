"""llm-d-router v0.10 plugin types end to end: real Envoy → real ``epp`` process (started with
the config) → small real model servers. One test per plugin kind at least (filter, scorer,
profile handler, producer, admitter, data source)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from devkit import envoy as e
from tests.support.epp_gateway import EppGateway
from tests.support.picker import OBJECTIVES
from tests.support.processes import BackgroundLoop, FakeModelServer

pytestmark = pytest.mark.envoy

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def v010_gateway(bg: BackgroundLoop, tmp: Path, servers: list[FakeModelServer], config: str,
                 labels: list[dict[str, str]] | None = None,
                 extra: list[dict[str, Any]] | None = None) -> EppGateway:
    """The shared gateway with a v0.10 config; most of these types are Alpha upstream:
    allowed, as upstream requires, by the flag."""
    return EppGateway(bg, tmp, servers, "--config-text", HEAD + config,
                      "--allow-experimental-plugins", labels=labels, extra=extra)


def test_utilization_filter_keeps_requests_off_a_queued_server(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    busy = servers[0]
    busy.waiting = 3
    gw = v010_gateway(bg, tmp_path, servers, """\
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
    gw = v010_gateway(bg, tmp_path, servers, """\
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
    gw = v010_gateway(bg, tmp_path, servers, """\
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
    gw = v010_gateway(bg, tmp_path, servers, """\
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


def test_session_id_producer_cookie_pins_a_session_through_the_gateway(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    gw = v010_gateway(bg, tmp_path, servers, """\
plugins:
- type: session-id-producer
  parameters: {cookieName: llm-d-session}
- type: agent-identity
- type: session-affinity-filter
  parameters:
    strategy: session_id
    sessionIdConfig:
      sources: [{attribute: SessionIDDataKey/session-id-producer}, {attribute: agent-identity}]
- type: random-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: session-affinity-filter}, {pluginRef: random-picker}]
""")
    try:
        by_cookie = gw.served(8, {"cookie": "theme=dark; llm-d-session=abc"})
        by_agent = gw.served(8, {"x-claude-code-session-id": "agent-1"})
    finally:
        gw.stop()
    assert len(by_cookie) == 1 and len(by_agent) == 1


class CustomGaugeServer(FakeModelServer):
    """A model server whose page also has ``custom_queue_depth{tier="gold"}``."""

    depth = 0.0

    def metrics_text(self) -> str:
        return (super().metrics_text()
                + f'custom_queue_depth{{tier="gold"}} {self.depth}\n')


def test_custom_metrics_feed_the_endpoint_attribute_plugins_through_the_gateway(
        bg: BackgroundLoop, tmp_path: Path) -> None:
    port = e.free_port()
    servers = [bg.run(CustomGaugeServer(f"pod-{i}", f"127.0.1.{i + 1}", port).start())
               for i in range(3)]
    servers[0].depth, servers[1].depth, servers[2].depth = 50.0, 2.0, 9.0
    engine = "inference.networking.k8s.io/engine-type"
    gw = v010_gateway(bg, tmp_path, servers, """\
plugins:
- type: metrics-data-source
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: custom-vllm
      queuedRequestsSpec: vllm:num_requests_waiting
      runningRequestsSpec: vllm:num_requests_running
      kvUsageSpec: vllm:kv_cache_usage_perc
      customMetrics:
      - {attributeKey: custom.queue_depth, metricSpec: "custom_queue_depth{tier=gold}"}
- type: endpoint-attribute-filter
  parameters:
    attribute: custom.queue_depth
    algorithm: {type: threshold, threshold: {operator: LessThan, value: 10}}
- type: endpoint-attribute-scorer
  parameters: {attributeKey: custom.queue_depth, algorithm: {type: linear_lower_is_better}}
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: core-metrics-extractor}]
schedulingProfiles:
- name: default
  plugins: [{pluginRef: endpoint-attribute-filter}, {pluginRef: endpoint-attribute-scorer},
            {pluginRef: max-score-picker}]
""", labels=[{engine: "custom-vllm"}] * 3)
    try:
        deadline = time.monotonic() + 10
        while True:  # the attributes arrive with the first scrapes
            served = gw.served(1)
            if served == {"pod-1": 1} or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        steady = gw.served(6)
    finally:
        gw.stop()
        for s in servers:
            bg.run(s.stop())
    # the filter drops pod-0 (50 ≥ 10), the scorer prefers pod-1 (2) over pod-2 (9)
    assert steady == {"pod-1": 6}


def test_probabilistic_admitter_sheds_sheddable_requests_from_a_saturated_pool(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    for s in servers:
        s.kv = 0.9  # past kvCacheUtilThreshold 0.8: saturation 1, shed probability 1
    gw = v010_gateway(bg, tmp_path, servers, """\
plugins:
- type: probabilistic-admitter
- type: random-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: random-picker}]
""", extra=OBJECTIVES)
    try:
        for s in servers:
            gw.wait_scraped(s.key, "kv_usage", 0.9)
        batch = [gw.complete(f"b{i}", {"x-gateway-inference-objective": "batch"})
                 for i in range(5)]
        chat = [gw.complete(f"c{i}", {"x-gateway-inference-objective": "chat"})
                for i in range(5)]
    finally:
        gw.stop()
    assert [r.status_code for r in batch] == [429] * 5, batch[0].text
    assert [r.status_code for r in chat] == [200] * 5


def test_burst_prefix_cache_producer_colocates_a_burst_through_the_gateway(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    gw = v010_gateway(bg, tmp_path, servers, """\
plugins:
- type: burst-prefix-cache-producer
  parameters: {windowDurationMs: 300}
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: prefix-cache-scorer}, {pluginRef: max-score-picker}]
""")
    prompt = "the same rollout prompt, sampled n times. " * 40
    try:
        for rnd in range(2):  # two bursts of 6 samples of one prompt each
            text = prompt + str(rnd)
            with ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(gw.complete, [text] * 6))
            assert all(a.status_code == 200 for a in answers), answers[0].text
            served = {a.headers["x-inference-pod"] for a in answers}
            # without the producer every score ties at 0 and max-score-picker spreads them
            assert len(served) == 1, served
    finally:
        gw.stop()


class DcgmExporter:
    """A small real DCGM-exporter page (``DCGM_FI_DEV_GPU_UTIL`` with the pod's label) on the
    pod's IP, as the exporter sidecar serves it on :9400."""

    def __init__(self, host: str, port: int, pod: str, util: float) -> None:
        self.host, self.port, self.pod, self.util = host, port, pod, util
        self._runner: Any = None

    async def start(self) -> DcgmExporter:
        from aiohttp import web

        async def page(_: web.Request) -> web.Response:
            return web.Response(text=f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",pod="{self.pod}"}} '
                                     f"{self.util}\n")

        app = web.Application()
        app.router.add_get("/metrics", page)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()


def test_dcgm_data_source_feeds_gpu_utilization_routing_through_the_gateway(
        bg: BackgroundLoop, tmp_path: Path, servers: list[FakeModelServer]) -> None:
    dport = e.free_port()
    exporters = [bg.run(DcgmExporter(s.host, dport, s.name, util).start())
                 for s, util in zip(servers, (95.0, 20.0, 60.0), strict=True)]
    gw = v010_gateway(bg, tmp_path, servers, f"""\
plugins:
- type: metrics-data-source
- type: core-metrics-extractor
- type: dcgm-data-source
  parameters: {{port: {dport}, interval: 50ms}}
- type: dcgm-extractor
- type: endpoint-attribute-filter
  parameters:
    attribute: GPUUtilization/dcgm-extractor
    algorithm: {{type: threshold, threshold: {{operator: LessThanOrEqual, value: 0.9}}}}
- type: endpoint-attribute-scorer
  parameters:
    attributeKey: GPUUtilization/dcgm-extractor
    algorithm: {{type: linear_lower_is_better, normalization: {{fixedRange: {{min: 0, max: 1}}}}}}
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{{pluginRef: core-metrics-extractor}}]
  - pluginRef: dcgm-data-source
    extractors: [{{pluginRef: dcgm-extractor}}]
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: endpoint-attribute-filter}}, {{pluginRef: endpoint-attribute-scorer}},
            {{pluginRef: max-score-picker}}]
""")
    try:
        deadline = time.monotonic() + 10
        while gw.served(1) != {"pod-1": 1}:  # the attribute arrives with the first scrapes
            assert time.monotonic() < deadline, "GPU utilization never reached the scorer"
            time.sleep(0.1)
        steady = gw.served(6)
    finally:
        gw.stop()
        for x in exporters:
            bg.run(x.stop())
    # pod-0 (95%) is filtered out, pod-1 (20%) outscores pod-2 (60%)
    assert steady == {"pod-1": 6}
