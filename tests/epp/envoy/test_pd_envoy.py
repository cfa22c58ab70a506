"""Prefill/decode disaggregation end to end: a real Envoy, the real ``epp`` process with
llm-d's P/D config, a ``pd-sidecar`` beside a simulated decode server and a simulated prefill
server (both with vLLM's NixlConnector role). Pods get their own loopback IPs and share the
pool's target port, as in a cluster: the decode pod's target port is the sidecar's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
from modelserver.pd import PREFILLER_HEADER, ROLE_LABEL
from sidecar.allowlist import PoolPrefillers
from sidecar.proxy import Sidecar, SidecarConfig, SidecarMetrics
from sim.config import ServerConfig
from sim.fleet import Fleet
from sim.pd import KVTransferConfig
from sim.profiles import TINY
from tests.support.processes import BackgroundLoop, EppProcess, pool_gateway_config

pytestmark = pytest.mark.envoy

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DECODE_IP, PREFILL_IP = "127.0.3.1", "127.0.3.2"
LONG = "long" * 1000  # 1,000 tokens (4 bytes each)
SHORT = "tiny" * 10  # 10 tokens: under the config's nonCachedTokens (16)

# llm-d's P/D config for simulators (its deploy/config/sim-pd-epp-config.yaml): the decider
# disaggregates when at least 16 prompt tokens are not cached on the decode pod.
PD_CONFIG = Path(__file__).parents[1] / "data" / "llm-d-sim-pd-epp-config.yaml"


def pool_objects(port: int) -> list[dict[str, Any]]:
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "pd", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}},
                     "targetPorts": [{"number": port}],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}
    pods = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": name, "namespace": "default",
                          "labels": {"app": "vllm", ROLE_LABEL: role}},
             "status": {"podIP": ip}}
            for name, ip, role in (("decode", DECODE_IP, "decode"),
                                   ("prefill", PREFILL_IP, "prefill"))]
    return [pool, *pods]


@dataclass
class PDGateway:
    bg: BackgroundLoop
    fleet: Fleet
    sidecar: Sidecar
    epp: EppProcess
    envoy: e.Envoy
    listen: int
    port: int

    @property
    def prefiller(self) -> str:
        return f"{PREFILL_IP}:{self.port}"

    def send(self, prompt: str, headers: dict[str, str] | None = None,
             **body: Any) -> httpx.Response:
        payload = {"model": MODEL, "prompt": prompt, "max_tokens": 4, **body}
        return httpx.post(f"http://127.0.0.1:{self.listen}/v1/completions",
                          content=orjson.dumps(payload), headers=headers or {}, timeout=20)

    def sim_metric(self, server: int, name: str) -> float:
        text = httpx.get(f"{self.fleet.urls[server]}/metrics", timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((name + " ", name + "{")))

    def sidecar_metric(self, name: str, **labels: str) -> float:
        return self.sidecar.metrics.registry.get_sample_value(name, labels) or 0.0

    def inflight(self) -> dict[str, int]:
        """The EPP's in-flight requests per endpoint (its ``/debug/pool``)."""
        pool = httpx.get(f"http://127.0.0.1:{self.epp.metrics}/debug/pool", timeout=5).json()
        return {ep["address"]: ep["inflight_requests"] for ep in pool["endpoints"]}

    def epp_metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.epp.metrics}/metrics", timeout=5).text
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(f"{name}{{") and all(
                       f'{k}="{v}"' in line for k, v in labels.items()) and want)


# Our load-aware-pd-decider in the same config: a long prompt stays on the decode pod while
# the prefill pod has 500 prompt tokens in flight and the decode pod at most 1 request.
SPILL_CONFIG = PD_CONFIG.read_text().replace(
    "- type: prefix-based-pd-decider\n  parameters:\n    nonCachedTokens: 16",
    "- type: load-aware-pd-decider\n  parameters:\n    nonCachedTokens: 16\n"
    "    prefillBacklogTokens: 500\n    maxDecodeRequests: 1").replace(
    "prefill: prefix-based-pd-decider", "prefill: load-aware-pd-decider")


@pytest.fixture
def gw(bg: BackgroundLoop, tmp_path: Path) -> Iterator[PDGateway]:
    yield from gateway(bg, tmp_path, PD_CONFIG)


@pytest.fixture
def spill_gw(bg: BackgroundLoop, tmp_path: Path) -> Iterator[PDGateway]:
    config = tmp_path / "spill-epp-config.yaml"
    config.write_text(SPILL_CONFIG)
    assert "load-aware-pd-decider" in SPILL_CONFIG and "prefix-based" not in SPILL_CONFIG
    yield from gateway(bg, tmp_path, config)


def gateway(bg: BackgroundLoop, tmp_path: Path, config: Path) -> Iterator[PDGateway]:
    port, decoder_port = e.free_port(), e.free_port()
    kv = KVTransferConfig(kv_role="kv_both", abort_timeout=60.0)
    fleet = Fleet([ServerConfig(host=DECODE_IP, port=decoder_port, name="decode", profile=TINY,
                                kv_transfer=kv),
                   ServerConfig(host=PREFILL_IP, port=port, name="prefill", profile=TINY,
                                kv_transfer=kv)])
    bg.run(fleet.start())
    manifests = tmp_path / "pool.yaml"
    manifests.write_text(yaml.safe_dump_all(pool_objects(port)))
    datastore = Datastore()
    ManifestSource(manifests, datastore, pool_name="pd").load()
    sidecar = Sidecar(SidecarConfig(decoder_url=f"http://{DECODE_IP}:{decoder_port}",
                                    prefill_timeout=5.0),
                      PoolPrefillers(datastore), SidecarMetrics())

    async def serve() -> web.AppRunner:
        runner = web.AppRunner(sidecar.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, DECODE_IP, port).start()
        return runner

    runner = bg.run(serve())
    epp = EppProcess(manifests, "--config-file", str(config),
                     log_path=tmp_path / "epp.log").wait_serving()
    admin, listen = e.free_port(), e.free_port()
    envoy = e.Envoy(pool_gateway_config(epp.port, admin, listen), admin_port=admin,
                    workdir=tmp_path / "envoy").start()
    try:
        yield PDGateway(bg, fleet, sidecar, epp, envoy, listen, port)
    finally:
        envoy.stop()
        epp.stop()
        bg.run(runner.cleanup())
        bg.run(fleet.stop())


def test_long_prompt_is_prefilled_on_the_prefill_pod_and_decoded_on_the_decode_pod(
        gw: PDGateway) -> None:
    r = gw.send(LONG)
    assert r.status_code == 200, r.text
    assert r.headers["x-inference-pod"] == "decode"
    assert r.json()["usage"]["completion_tokens"] == 4
    assert gw.sim_metric(1, "vllm:prompt_tokens_total") == 1000  # the prefill leg
    assert gw.sim_metric(1, "vllm:generation_tokens_total") == 1
    assert gw.sim_metric(0, "vllm:external_prefix_cache_hits_total") == 999  # KV pulled
    assert gw.sim_metric(0, "vllm:nixl_num_failed_transfers_total") == 0
    assert gw.sidecar_metric("pd_sidecar_requests_total", mode="disaggregated") == 1
    assert gw.epp_metric("llm_d_inference_scheduler_disagg_decision_total",
                         decision_type="prefill-decode") == 1


def test_streaming_chat_with_a_long_prompt_is_disaggregated(gw: PDGateway) -> None:
    r = httpx.post(f"http://127.0.0.1:{gw.listen}/v1/chat/completions", content=orjson.dumps({
        "model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 5,
        "stream": True}), timeout=20)
    assert r.status_code == 200
    assert r.text.rstrip().endswith("data: [DONE]")
    assert gw.sim_metric(1, "vllm:generation_tokens_total") == 1
    assert gw.sim_metric(0, "vllm:external_prefix_cache_hits_total") > 0
    assert gw.sidecar_metric("pd_sidecar_requests_total", mode="disaggregated") == 1


def test_short_prompt_is_not_disaggregated(gw: PDGateway) -> None:
    r = gw.send(SHORT)
    assert r.status_code == 200, r.text
    assert r.headers["x-inference-pod"] == "decode"
    assert gw.sim_metric(1, "vllm:prompt_tokens_total") == 0
    assert gw.sim_metric(0, "vllm:external_prefix_cache_queries_total") == 0
    assert gw.sidecar_metric("pd_sidecar_requests_total", mode="local") == 1
    assert gw.epp_metric("llm_d_inference_scheduler_disagg_decision_total",
                         decision_type="decode-only") == 1


def test_client_cannot_choose_a_prefiller_even_an_allowed_one(gw: PDGateway) -> None:
    # The named pod is a real prefill pod of the pool, so the sidecar would honour the
    # header: only the EPP removing it keeps this short prompt from being disaggregated.
    r = gw.send(SHORT, {PREFILLER_HEADER: gw.prefiller})
    assert r.status_code == 200, r.text
    assert gw.sim_metric(1, "vllm:prompt_tokens_total") == 0
    assert gw.sidecar_metric("pd_sidecar_requests_total", mode="local") == 1
    assert gw.sidecar_metric("pd_sidecar_requests_total", mode="disaggregated") == 0


def test_client_prefiller_is_replaced_by_the_epp_pick(gw: PDGateway) -> None:
    r = gw.send(LONG, {PREFILLER_HEADER: "169.254.169.254:80"})
    assert r.status_code == 200, r.text
    assert gw.sim_metric(1, "vllm:prompt_tokens_total") == 1000
    assert gw.sidecar_metric("pd_sidecar_requests_total", mode="disaggregated") == 1
    assert gw.sidecar_metric("pd_sidecar_prefiller_rejected_total") == 0


def test_killed_prefiller_costs_the_client_no_error(gw: PDGateway) -> None:
    gw.bg.run(gw.fleet.kill(gw.port))
    r = gw.send(LONG)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
    # Either the EPP already saw the prefill pod fail its scrape (no prefiller named) or the
    # sidecar could not reach it (counted fallback): the decode pod computes the prompt.
    assert gw.sim_metric(0, "vllm:prompt_tokens_total") == 1000
    assert gw.sidecar_metric("pd_sidecar_requests_total", mode="local") == 1
    assert gw.sidecar_metric("pd_sidecar_requests_total", mode="disaggregated") == 0


def test_prefill_pod_counts_the_request_in_flight_while_it_prefills(gw: PDGateway) -> None:
    # The prefill pod hangs, so the sidecar's prefill leg is outstanding until its 5 s
    # timeout (then the decode pod computes the prompt); meanwhile the EPP counts the request
    # on the prefill pod as well as on the decode pod, and releases both once it is over.
    httpx.post(f"{gw.fleet.urls[1]}/sim/faults", json={"hang": True}, timeout=5)
    decode = f"{DECODE_IP}:{gw.port}"
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(gw.send, LONG)
        seen: dict[str, int] = {}
        while not sent.done() and seen.get(gw.prefiller) != 1:
            seen = gw.inflight()
        assert seen == {decode: 1, gw.prefiller: 1}
        r = sent.result()
    assert r.status_code == 200, r.text
    assert gw.sidecar_metric("pd_sidecar_prefill_fallbacks_total", reason="timeout") == 1
    deadline = time.monotonic() + 10  # the EPP hears the end just after the client
    while gw.inflight() != {decode: 0, gw.prefiller: 0} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gw.inflight() == {decode: 0, gw.prefiller: 0}


def test_load_aware_decider_decodes_locally_while_the_prefill_pod_is_backlogged(
        spill_gw: PDGateway) -> None:
    gw = spill_gw
    # The prefill pod hangs: the first long prompt's prefill leg stays outstanding (1,000
    # tokens in flight there, 1 request on the decode pod) until the sidecar's 5 s timeout.
    httpx.post(f"{gw.fleet.urls[1]}/sim/faults", json={"hang": True}, timeout=5)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(gw.send, LONG)
        while not first.done() and gw.inflight().get(gw.prefiller) != 1:
            time.sleep(0.01)
        second = gw.send("more" * 1000)  # backlogged prefill pod, 1 request on decode: spill
        assert second.status_code == 200, second.text
        assert second.json()["usage"]["completion_tokens"] == 4
        # decoded on the decode pod without a prefill leg, while the first still waits
        assert not first.done()
        assert gw.sidecar_metric("pd_sidecar_requests_total", mode="local") == 1
        assert gw.epp_metric("llm_d_inference_scheduler_disagg_decision_total",
                             decision_type="decode-only") == 1
        assert gw.sim_metric(0, "vllm:prompt_tokens_total") == 1000
        assert first.result().status_code == 200
    # the first was disaggregated (and fell back to the decode pod at the timeout)
    assert gw.epp_metric("llm_d_inference_scheduler_disagg_decision_total",
                         decision_type="prefill-decode") == 1
    assert gw.sidecar_metric("pd_sidecar_prefill_fallbacks_total", reason="timeout") == 1
    # once the prefill pod is free again a long prompt is disaggregated as before
    httpx.post(f"{gw.fleet.urls[1]}/sim/faults", json={"hang": False}, timeout=5)
    third = gw.send("once" * 1000)
    assert third.status_code == 200, third.text
    assert gw.sidecar_metric("pd_sidecar_requests_total", mode="disaggregated") == 1
    assert gw.sim_metric(0, "vllm:external_prefix_cache_hits_total") == 999
