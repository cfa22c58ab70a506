"""The P/D routing sidecar in front of real simulated prefill and decode servers.

The allow-list is fed by the EPP's own manifests source, from a file that names the pods the
way Kubernetes would (pod IPs on loopback, ``llm-d.ai/role`` labels).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from aiohttp import web

from devkit.net import free_port
from epp.datastore import Datastore
from epp.sources import ManifestSource
from modelserver.pd import PREFILLER_HEADER, ROLE_LABEL
from sidecar.allowlist import AllowAny, PoolPrefillers
from sidecar.proxy import Sidecar, SidecarConfig, SidecarMetrics
from sim.config import ServerConfig
from sim.fleet import Fleet, start_fleet
from sim.pd import KVTransferConfig
from sim.profiles import TINY

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPT = "abcd" * 200  # 200 tokens
KV = KVTransferConfig(kv_role="kv_both", abort_timeout=60.0)

DECODE_IP, PREFILL_IP, PREFILL2_IP, NO_CONNECTOR_IP, UNLABELLED_IP = (
    "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


def _server(ip: str, name: str, kv: KVTransferConfig | None = KV) -> ServerConfig:
    return ServerConfig(host=ip, port=0, name=name, profile=TINY, kv_transfer=kv)


def _pod(name: str, ip: str, role: str | None) -> dict[str, Any]:
    labels = {"app": "vllm"}
    if role is not None:
        labels[ROLE_LABEL] = role
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "status": {"podIP": ip}}


def write_manifests(path: Path, ports: list[int], pods: list[dict[str, Any]]) -> None:
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "pd", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}},
                     "targetPorts": [{"number": p} for p in sorted(set(ports))],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}
    path.write_text(yaml.safe_dump_all([pool, *pods]))


@dataclass
class Stack:
    fleet: Fleet
    sidecar: Sidecar
    url: str
    source: ManifestSource
    manifests: Path
    client: httpx.AsyncClient

    @property
    def decode(self) -> str:
        return self.fleet.urls[0]

    def addr(self, i: int) -> str:
        s = self.fleet.servers[i]
        return f"{s.cfg.host}:{s.port}"

    async def metric(self, server: int, name: str) -> float:
        text = (await self.client.get(f"{self.fleet.urls[server]}/metrics")).text
        return _sum(text, name)

    def sidecar_metric(self, name: str, **labels: str) -> float:
        value = self.sidecar.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    async def complete(self, prefillers: str | None, **body: Any) -> httpx.Response:
        headers = {PREFILLER_HEADER: prefillers} if prefillers is not None else {}
        payload = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, **body}
        return await self.client.post(f"{self.url}/v1/completions", json=payload,
                                      headers=headers)


def _sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    """Decode (0), prefill (1), second prefill (2), and a prefill-labelled server without a
    connector (3), a sidecar in front of the decode server, and the pool in a manifests file."""
    async with _stack(tmp_path, "nixlv2") as s:
        yield s


@pytest.fixture
async def shared_storage(tmp_path: Path) -> AsyncIterator[Stack]:
    """The same servers, the sidecar in ``--kv-connector shared-storage`` mode."""
    async with _stack(tmp_path, "shared-storage") as s:
        yield s


@contextlib.asynccontextmanager
async def _stack(tmp_path: Path, kv_connector: str) -> AsyncIterator[Stack]:
    configs = [_server(DECODE_IP, "decode"), _server(PREFILL_IP, "prefill"),
               _server(PREFILL2_IP, "prefill-2"), _server(NO_CONNECTOR_IP, "noconn", kv=None)]
    async with start_fleet(configs) as fleet, httpx.AsyncClient(timeout=20) as client:
        manifests = tmp_path / "pool.yaml"
        write_manifests(manifests, fleet.ports, [
            _pod("decode", DECODE_IP, "decode"), _pod("prefill", PREFILL_IP, "prefill"),
            _pod("prefill-2", PREFILL2_IP, "prefill"), _pod("noconn", NO_CONNECTOR_IP, "both"),
            _pod("plain", UNLABELLED_IP, None)])
        datastore = Datastore()
        source = ManifestSource(manifests, datastore, pool_name="pd")
        source.load()
        sidecar = Sidecar(SidecarConfig(decoder_url=fleet.urls[0], prefill_timeout=2.0,
                                        kv_connector=kv_connector),
                          PoolPrefillers(datastore), SidecarMetrics())
        runner = web.AppRunner(sidecar.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield Stack(fleet, sidecar, f"http://127.0.0.1:{port}", source, manifests, client)
        finally:
            await runner.cleanup()


async def test_request_is_prefilled_on_the_named_prefiller_and_decoded_locally(
    stack: Stack,
) -> None:
    r = await stack.complete(stack.addr(1))
    assert r.status_code == 200, r.text
    assert r.headers["x-inference-pod"] == "decode"
    assert r.json()["usage"]["completion_tokens"] == 8
    assert "kv_transfer_params" not in r.json()
    assert await stack.metric(1, "vllm:prompt_tokens_total") == 200
    assert await stack.metric(1, "vllm:generation_tokens_total") == 1
    assert await stack.metric(0, "vllm:external_prefix_cache_hits_total") == 199
    assert await stack.metric(0, "vllm:nixl_num_failed_transfers_total") == 0
    assert stack.sidecar_metric("pd_sidecar_requests_total", mode="disaggregated") == 1


async def test_streaming_chat_is_disaggregated_and_streamed_back(stack: Stack) -> None:
    r = await stack.client.post(f"{stack.url}/v1/chat/completions", headers={
        PREFILLER_HEADER: stack.addr(1)}, json={
        "model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5,
        "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get(
        "content")) == 5
    assert await stack.metric(0, "vllm:external_prefix_cache_hits_total") > 0
    assert await stack.metric(1, "vllm:generation_tokens_total") == 1


async def test_without_the_header_the_request_passes_through(stack: Stack) -> None:
    r = await stack.complete(None)
    assert r.status_code == 200
    assert await stack.metric(1, "vllm:prompt_tokens_total") == 0
    assert await stack.metric(0, "vllm:prefix_cache_queries_total") == 200
    assert stack.sidecar_metric("pd_sidecar_requests_total", mode="local") == 1


async def test_first_allowed_entry_of_the_header_is_used(stack: Stack) -> None:
    r = await stack.complete(f"10.9.9.9:80, {stack.addr(2)}, {stack.addr(1)}")
    assert r.status_code == 200
    assert await stack.metric(2, "vllm:prompt_tokens_total") == 200
    assert await stack.metric(1, "vllm:prompt_tokens_total") == 0


@pytest.mark.parametrize("target", [
    "169.254.169.254:80",  # not in the pool at all (cloud metadata)
    "decode",  # the decode pod: in the pool, but its role cannot prefill
    "unlabelled",  # in the pool without a role label
    "wrong-port",  # a prefill pod's IP on a port that is no target port
])
async def test_a_prefiller_outside_the_pool_is_ignored_and_decoded_locally(
    stack: Stack, target: str,
) -> None:
    value = {"decode": stack.addr(0), "unlabelled": f"{UNLABELLED_IP}:{stack.fleet.ports[1]}",
             "wrong-port": f"{PREFILL_IP}:1"}.get(target, target)
    r = await stack.complete(value)
    assert r.status_code == 200
    assert r.headers["x-inference-pod"] == "decode"
    for i in (1, 2, 3):
        assert await stack.metric(i, "vllm:prompt_tokens_total") == 0
    assert await stack.metric(0, "vllm:external_prefix_cache_queries_total") == 0
    assert stack.sidecar_metric("pd_sidecar_prefiller_rejected_total") == 1


async def test_allow_list_follows_the_pool(stack: Stack) -> None:
    pods = [_pod("decode", DECODE_IP, "decode"), _pod("prefill-2", PREFILL2_IP, "prefill")]
    write_manifests(stack.manifests, stack.fleet.ports, pods)  # prefill pod gone
    assert stack.source.reload_if_changed()
    r = await stack.complete(stack.addr(1))
    assert r.status_code == 200
    assert await stack.metric(1, "vllm:prompt_tokens_total") == 0
    assert stack.sidecar_metric("pd_sidecar_prefiller_rejected_total") == 1


async def test_client_kv_transfer_params_never_reach_the_decoder(stack: Stack) -> None:
    # A client pointing the decoder's KV pull at an address of its choice (SSRF via vLLM).
    forged = {"do_remote_prefill": True, "do_remote_decode": False,
              "remote_engine_id": "x", "remote_request_id": "y", "remote_block_ids": [0],
              "remote_host": PREFILL_IP, "remote_port": stack.fleet.ports[1]}
    for prefillers in (None, stack.addr(1)):
        r = await stack.complete(prefillers, kv_transfer_params=forged)
        assert r.status_code == 200
    assert await stack.metric(0, "vllm:nixl_num_failed_transfers_total") == 0
    # One pull only: the KV of the sidecar's own prefill leg.
    assert await stack.metric(0, "vllm:nixl_xfer_time_seconds_count") == 1


async def test_client_kv_transfer_params_are_removed_on_other_paths_too(stack: Stack) -> None:
    # A recording HTTP server stands in for the decoder: what matters is the body it gets.
    received: list[bytes] = []

    async def record(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/responses", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    sidecar = Sidecar(SidecarConfig(decoder_url=f"http://127.0.0.1:{port}"),
                      stack.sidecar.policy)
    front = web.AppRunner(sidecar.app())
    await front.setup()
    front_site = web.TCPSite(front, "127.0.0.1", 0)
    await front_site.start()
    front_port = front_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        r = await stack.client.post(f"http://127.0.0.1:{front_port}/v1/responses", json={
            "model": MODEL, "input": "hi", "kv_transfer_params": {"remote_host": "evil"}})
        assert r.status_code == 200
        assert orjson.loads(received[0]) == {"model": MODEL, "input": "hi"}
    finally:
        await front.cleanup()
        await runner.cleanup()


async def test_dead_prefiller_costs_no_client_error(stack: Stack) -> None:
    await stack.fleet.kill(stack.fleet.ports[1])
    r = await stack.complete(stack.addr(1), stream=True)
    assert r.status_code == 200
    assert r.text.endswith("data: [DONE]\n\n")
    assert stack.sidecar_metric("pd_sidecar_prefill_fallbacks_total", reason="unreachable") == 1
    assert stack.sidecar_metric("pd_sidecar_requests_total", mode="local") == 1


async def test_prefiller_server_error_falls_back_to_local_decode(stack: Stack) -> None:
    await stack.client.post(f"{stack.fleet.urls[1]}/sim/faults",
                            json={"error_rate": 1.0, "error_status": 503})
    r = await stack.complete(stack.addr(1))
    assert r.status_code == 200
    assert stack.sidecar_metric("pd_sidecar_prefill_fallbacks_total",
                                reason="error_status") == 1


async def test_hung_prefiller_times_out_to_local_decode(stack: Stack) -> None:
    await stack.client.post(f"{stack.fleet.urls[1]}/sim/faults", json={"hang": True})
    r = await stack.complete(stack.addr(1))
    assert r.status_code == 200
    assert stack.sidecar_metric("pd_sidecar_prefill_fallbacks_total", reason="timeout") == 1


async def test_prefiller_without_connector_falls_back_to_local_decode(stack: Stack) -> None:
    r = await stack.complete(stack.addr(3))
    assert r.status_code == 200
    assert stack.sidecar_metric("pd_sidecar_prefill_fallbacks_total",
                                reason="bad_response") == 1
    assert await stack.metric(0, "vllm:external_prefix_cache_hits_total") == 0


async def test_prefiller_client_error_goes_back_with_its_status(stack: Stack) -> None:
    r = await stack.complete(stack.addr(1), model="no-such-model")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "NotFoundError"
    assert await stack.metric(0, "vllm:prompt_tokens_total") == 0  # never decoded


@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "not valid JSON"), (b"[1, 2]", "must be a JSON object")])
async def test_malformed_body_with_the_header_is_a_400(
    stack: Stack, body: bytes, message: str,
) -> None:
    r = await stack.client.post(f"{stack.url}/v1/completions", content=body, headers={
        PREFILLER_HEADER: stack.addr(1), "content-type": "application/json"})
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert message in err["message"] and err["type"] == "invalid_request_error"


async def test_decoder_errors_keep_their_status(stack: Stack) -> None:
    await stack.client.post(f"{stack.decode}/sim/faults",
                            json={"error_rate": 1.0, "error_status": 429})
    r = await stack.complete(stack.addr(1))
    assert r.status_code == 429
    assert r.json()["error"]["code"] == 429


async def test_decoder_dying_mid_stream_ends_the_clients_stream(stack: Stack) -> None:
    payload = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1500, "stream": True}
    async with stack.client.stream("POST", f"{stack.url}/v1/completions", json=payload,
                                   headers={PREFILLER_HEADER: stack.addr(1)}) as r:
        assert r.status_code == 200
        received = b""
        with contextlib.suppress(httpx.HTTPError):  # a cut connection is fine too
            async for chunk in r.aiter_bytes():
                if not received:
                    await stack.fleet.kill(stack.fleet.ports[0])
                received += chunk
    # The stream ended (no hang) and shows the client it is incomplete.
    assert received.startswith(b"data: ")
    assert b"[DONE]" not in received


async def test_unreachable_decoder_is_a_503(stack: Stack) -> None:
    await stack.fleet.kill(stack.fleet.ports[0])
    r = await stack.complete(stack.addr(1))
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "decoder_unavailable"


async def test_other_paths_pass_through_and_health_is_answered(stack: Stack) -> None:
    models = await stack.client.get(f"{stack.url}/v1/models")
    assert models.status_code == 200 and models.headers["x-inference-pod"] == "decode"
    assert (await stack.client.get(f"{stack.url}/health")).status_code == 200
    metrics = await stack.client.get(f"{stack.url}/metrics")
    assert "vllm:num_requests_running" in metrics.text


# -- llm-d's shared-storage protocol (vLLM's ExampleConnector: KV through a shared folder) --
# The simulator has no shared folder, so its decoder recomputes the prompt; these tests check
# what the sidecar sends and counts (docs/real-vllm.md has the run against real vLLM).

async def test_shared_storage_prefills_without_params_then_sends_the_clients_body(
    shared_storage: Stack,
) -> None:
    s = shared_storage
    r = await s.complete(s.addr(1), stream=True, kv_transfer_params={"remote_host": "x"})
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    # The prefill leg: the whole prompt, one token, and no NIXL params (a NIXL prefiller
    # would otherwise hold the KV for a pull that never comes).
    assert await s.metric(1, "vllm:prompt_tokens_total") == 200
    assert await s.metric(1, "vllm:generation_tokens_total") == 1
    assert (await s.client.get(f"{s.fleet.urls[1]}/sim/state")).json()["kv_held"] == 0
    # The decode leg: the client's request (8 tokens), no params (neither the client's nor
    # any from the prefiller), so the decoder pulled nothing.
    assert await s.metric(0, "vllm:generation_tokens_total") == 8
    assert await s.metric(0, "vllm:external_prefix_cache_queries_total") == 0
    assert await s.metric(0, "vllm:nixl_num_failed_transfers_total") == 0
    assert s.sidecar_metric("pd_sidecar_requests_total", mode="disaggregated") == 1


async def test_shared_storage_dead_prefiller_costs_no_client_error(
    shared_storage: Stack,
) -> None:
    s = shared_storage
    await s.fleet.kill(s.fleet.ports[1])
    r = await s.complete(s.addr(1))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
    assert s.sidecar_metric("pd_sidecar_prefill_fallbacks_total", reason="unreachable") == 1
    assert s.sidecar_metric("pd_sidecar_requests_total", mode="local") == 1


async def test_shared_storage_prefiller_client_error_goes_back(shared_storage: Stack) -> None:
    s = shared_storage
    r = await s.complete(s.addr(3), model="no-such-model")
    assert r.status_code == 404
    assert await s.metric(0, "vllm:prompt_tokens_total") == 0


def test_an_unknown_connector_in_the_config_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_connector must be one of nixlv2, shared-storage"):
        SidecarConfig(decoder_url="http://127.0.0.1:1", kv_connector="sglang")


@pytest.mark.parametrize(("args", "message"), [
    ([], "--enable-ssrf-protection needs --inference-pool"),
    (["--kv-connector", "sglang"], "--kv-connector sglang is llm-d's, not implemented here"),
    (["--kv-connector", "nixl"], "--kv-connector must be one of nixlv2"),
    (["--inference-pool", "a/b/c"], "--inference-pool must be NAME or NAMESPACE/NAME"),
    (["--manifests", "/nonexistent/pool.yaml"], "no such file or directory"),
    (["--prefill-timeout", "0s"], "--prefill-timeout must be positive"),
])
def test_cli_errors_are_one_line(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "sidecar.main", "--metrics-port", "0", *args],
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin"})
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pd-sidecar: error: ")
    assert message in lines[0]


@pytest.mark.parametrize("connector", ["nixlv2", "shared-storage"])
async def test_cli_serves_a_disaggregated_request(tmp_path: Path, connector: str) -> None:
    configs = [_server(DECODE_IP, "decode"), _server(PREFILL_IP, "prefill")]
    async with start_fleet(configs) as fleet, httpx.AsyncClient(timeout=20) as client:
        manifests = tmp_path / "pool.yaml"
        write_manifests(manifests, fleet.ports, [_pod("decode", DECODE_IP, "decode"),
                                                 _pod("prefill", PREFILL_IP, "prefill")])
        port, metrics_port = free_port(), free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sidecar.main", "--port", str(port), "--host", "127.0.0.1",
            "--vllm-port", str(fleet.ports[0]), "--manifests", str(manifests),
            "--metrics-port", str(metrics_port), "--kv-connector", connector,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert b"pd-sidecar ready" in line
            prefiller = f"{PREFILL_IP}:{fleet.ports[1]}"
            r = await client.post(f"http://127.0.0.1:{port}/v1/completions", headers={
                PREFILLER_HEADER: prefiller}, json={"model": MODEL, "prompt": PROMPT,
                                                    "max_tokens": 3})
            assert r.status_code == 200
            text = (await client.get(f"{fleet.urls[1]}/metrics")).text
            assert _sum(text, "vllm:prompt_tokens_total") == 200
            decoder = (await client.get(f"{fleet.urls[0]}/metrics")).text
            pulled = _sum(decoder, "vllm:external_prefix_cache_hits_total")
            assert pulled == (199 if connector == "nixlv2" else 0)
            sidecar_metrics = (await client.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            assert _sum(sidecar_metrics, "pd_sidecar_requests_total") == 1
        finally:
            proc.terminate()
            assert await asyncio.wait_for(proc.wait(), 30) == 0


UNCHECKABLE_BODIES = [
    # orjson refuses these, Python's json (the model server's side) reads them: the sidecar
    # could not strip kv_transfer_params, so it must not forward them (issue 31, item 9).
    b'{"model": "m", "prompt": "hi", "temperature": NaN, '
    b'"kv_transfer_params": {"remote_host": "evil"}}',
    b'{"model": "m", "prompt": "\\ud800", "kv_transfer_params": {"remote_host": "evil"}}',
    b'{"model": "m", "prompt": "hi", "top_p": Infinity}',
]


@pytest.mark.parametrize("body", UNCHECKABLE_BODIES)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/responses"])
async def test_a_body_the_parser_rejects_is_refused_not_forwarded(body: bytes, path: str) -> None:
    received: list[bytes] = []

    async def record(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post(path, record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    sidecar = Sidecar(SidecarConfig(decoder_url=f"http://127.0.0.1:{port}"), AllowAny())
    front = web.AppRunner(sidecar.app())
    await front.setup()
    front_site = web.TCPSite(front, "127.0.0.1", 0)
    await front_site.start()
    front_port = front_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with httpx.AsyncClient() as client:
            r = await client.post(f"http://127.0.0.1:{front_port}{path}", content=body,
                                  headers={"content-type": "application/json"})
            assert r.status_code == 400
            assert r.json()["error"]["type"] == "invalid_request_error"
            # An escaped key is still found and stripped (orjson reads the escape).
            escaped = b'{"model": "m", "input": "hi", "kv_transfer\\u005fparams": {"a": 1}}'
            ok = await client.post(f"http://127.0.0.1:{front_port}{path}", content=escaped,
                                   headers={"content-type": "application/json"})
            assert ok.status_code == 200
        assert len(received) == 1 and b"kv_transfer" not in received[0]
        assert orjson.loads(received[0]) == {"model": "m", "input": "hi"}
    finally:
        await front.cleanup()
        await runner.cleanup()
