"""Encode/prefill/decode disaggregation end to end (issue #29): a real Envoy, the real ``epp``
with llm-d-router v0.10's E/P/D config plus encoder-cache affinity in the encode profile, a
``pd-sidecar`` beside a simulated decode server, a simulated prefill server and two
simulated encode servers sharing an EC folder (vLLM's ECSharedStorageConnector). Pods get
their own loopback IPs and share the pool's target port, as in a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from aiohttp import web

from devkit import envoy as e
from epp.datastore import Datastore
from epp.sources import ManifestSource
from modelserver.pd import ROLE_LABEL
from sidecar.allowlist import PoolPrefillers
from sidecar.proxy import Sidecar, SidecarConfig, SidecarMetrics
from sim.config import ServerConfig
from sim.encoder import ECTransferConfig
from sim.fleet import Fleet
from sim.pd import KVTransferConfig
from sim.profiles import TINY
from tests.support.processes import BackgroundLoop, EppProcess, pool_gateway_config

pytestmark = pytest.mark.envoy

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PODS = (("decode", "127.0.4.1", "decode"), ("prefill", "127.0.4.2", "prefill"),
        ("encode-1", "127.0.4.3", "encode"), ("encode-2", "127.0.4.4", "encode"))

# llm-d-router v0.10's deploy/config/sim-e-p-d-epp-config.yaml (written here, not copied),
# with mm-embeddings-cache-scorer added to the encode profile.
EPD_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: encode-filter
- type: prefill-filter
- type: decode-filter
- type: mm-embeddings-cache-producer
  parameters: {cacheSizeInMBPerServer: 2048}
- type: mm-embeddings-cache-scorer
- type: disagg-profile-handler
  parameters:
    deciders: {encode: always-disagg-multimodal-decider, prefill: prefix-based-pd-decider}
- type: always-disagg-multimodal-decider
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 16}
schedulingProfiles:
- name: encode
  plugins:
  - pluginRef: encode-filter
  - {pluginRef: mm-embeddings-cache-scorer, weight: 4}
  - {pluginRef: queue-scorer, weight: 1}
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer, weight: 1}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer, weight: 1}]
"""


def pool_objects(port: int) -> list[dict[str, Any]]:
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "epd", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}},
                     "targetPorts": [{"number": port}],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}
    pods = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": name, "namespace": "default",
                          "labels": {"app": "vllm", ROLE_LABEL: role}},
             "status": {"podIP": ip}} for name, ip, role in PODS]
    return [pool, *pods]


@dataclass
class EPDGateway:
    fleet: Fleet
    sidecar: Sidecar
    epp: EppProcess
    listen: int

    def chat(self, *urls: str, headers: dict[str, str] | None = None) -> httpx.Response:
        content: list[dict[str, Any]] = [{"type": "text", "text": "what is in the picture?"}]
        content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        body = {"model": MODEL, "max_tokens": 4,
                "messages": [{"role": "user", "content": content}]}
        return httpx.post(f"http://127.0.0.1:{self.listen}/v1/chat/completions",
                          content=orjson.dumps(body), headers=headers or {}, timeout=20)

    def state(self, i: int) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(f"{self.fleet.urls[i]}/sim/state", timeout=5).json()
        return data

    def sim_metric(self, i: int, name: str) -> float:
        text = httpx.get(f"{self.fleet.urls[i]}/metrics", timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((name + " ", name + "{")))

    def epp_metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.epp.metrics}/metrics", timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((name + " ", name + "{")) and all(
                       f'{k}="{v}"' in line for k, v in labels.items()))

    def encoded(self) -> list[int]:
        """Items each encoder (fleet servers 2 and 3) encoded itself."""
        return [self.state(i)["mm_encoded"] for i in (2, 3)]


@pytest.fixture
def gw(bg: BackgroundLoop, tmp_path: Path) -> Iterator[EPDGateway]:
    port, decoder_port = e.free_port(), e.free_port()
    kv = KVTransferConfig(kv_role="kv_both", abort_timeout=60.0)
    ec = tmp_path / "ec"
    consumer, producer = ECTransferConfig("ec_consumer", ec), ECTransferConfig("ec_producer", ec)
    (_, d_ip, _), (_, p_ip, _), (_, e1_ip, _), (_, e2_ip, _) = PODS
    fleet = Fleet([
        ServerConfig(host=d_ip, port=decoder_port, name="decode", profile=TINY,
                     kv_transfer=kv, ec_transfer=consumer),
        ServerConfig(host=p_ip, port=port, name="prefill", profile=TINY, kv_transfer=kv,
                     ec_transfer=consumer),
        ServerConfig(host=e1_ip, port=port, name="encode-1", profile=TINY, ec_transfer=producer),
        ServerConfig(host=e2_ip, port=port, name="encode-2", profile=TINY, ec_transfer=producer),
    ])
    bg.run(fleet.start())
    manifests = tmp_path / "pool.yaml"
    manifests.write_text(yaml.safe_dump_all(pool_objects(port)))
    config = tmp_path / "epd-epp-config.yaml"
    config.write_text(EPD_CONFIG)
    datastore = Datastore()
    ManifestSource(manifests, datastore, pool_name="epd").load()
    sidecar = Sidecar(SidecarConfig(decoder_url=f"http://{d_ip}:{decoder_port}",
                                    prefill_timeout=5.0, ec_connector="ec-example"),
                      PoolPrefillers(datastore), SidecarMetrics())

    async def serve() -> web.AppRunner:
        runner = web.AppRunner(sidecar.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, d_ip, port).start()
        return runner

    runner = bg.run(serve())
    epp = EppProcess(manifests, "--config-file", str(config),
                     log_path=tmp_path / "epp.log").wait_serving()
    admin, listen = e.free_port(), e.free_port()
    envoy = e.Envoy(pool_gateway_config(epp.port, admin, listen), admin_port=admin,
                    workdir=tmp_path / "envoy").start()
    try:
        yield EPDGateway(fleet, sidecar, epp, listen)
    finally:
        envoy.stop()
        epp.stop()
        bg.run(runner.cleanup())
        bg.run(fleet.stop())


def test_an_image_is_encoded_on_an_encode_pod_prefilled_and_decoded(gw: EPDGateway) -> None:
    r = gw.chat("https://example.com/cat.png")
    assert r.status_code == 200, r.text
    assert r.headers["x-inference-pod"] == "decode"
    assert r.json()["usage"]["completion_tokens"] == 4
    assert sorted(gw.encoded()) == [0, 1]  # the encode stage ran on one encoder
    prefill, decode = gw.state(1), gw.state(0)
    assert (prefill["mm_loaded"], prefill["mm_encoded"]) == (1, 0)  # read through the EC
    assert (decode["mm_loaded"], decode["mm_encoded"]) == (0, 0)  # decoded from pulled KV
    assert gw.sim_metric(0, "vllm:external_prefix_cache_hits_total") > 225  # the image's KV
    assert gw.epp_metric("llm_d_epp_disagg_decision_total",
                         decision_type="encode-prefill-decode") == 1


def test_text_only_chat_skips_the_encode_stage(gw: EPDGateway) -> None:
    r = gw.chat()
    assert r.status_code == 200, r.text
    assert [gw.state(i)["finished"] for i in (2, 3)] == [0, 0]
    assert gw.epp_metric("llm_d_epp_encoder_cache_queries_total") == 0


def test_a_repeated_image_goes_back_to_the_encoder_that_holds_it(gw: EPDGateway) -> None:
    assert gw.chat("https://example.com/dog.png").status_code == 200
    holder = gw.encoded().index(1)
    for _ in range(4):  # by chance alone: 1 in 16
        assert gw.chat("https://example.com/dog.png").status_code == 200
    encoders = [gw.state(i) for i in (2, 3)]
    assert encoders[holder]["finished"] == 5
    assert encoders[1 - holder]["finished"] == 0
    assert gw.sim_metric(2 + holder, "vllm:mm_cache_hits_total") == 4  # its encoder cache
    assert gw.epp_metric("llm_d_epp_encoder_cache_hits_total") >= 4

