"""The sidecar's encode stage (E/PD, E/P/D; issue #29): multimodal items go to the encoders the
EPP named in ``x-encoder-hosts-ports``, real simulated encode servers publish them through the
EC shared-storage connector, and the decode server loads instead of encoding them."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from epp.datastore import Datastore
from epp.sources import ManifestSource
from modelserver.multimodal import ENCODER_HEADER
from sidecar.allowlist import PoolPrefillers
from sidecar.proxy import Sidecar, SidecarConfig, SidecarMetrics
from sim.config import ServerConfig
from sim.encoder import ECTransferConfig
from sim.fleet import Fleet, start_fleet
from sim.profiles import TINY
from tests.sidecar.test_sidecar import MODEL, _pod, write_manifests

DECODE_IP, ENC1_IP, ENC2_IP, STRANGER_IP = "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"


@dataclass
class Stack:
    fleet: Fleet
    sidecar: Sidecar
    url: str
    client: httpx.AsyncClient

    def addr(self, i: int) -> str:
        s = self.fleet.servers[i]
        return f"{s.cfg.host}:{s.port}"

    async def state(self, i: int) -> dict[str, Any]:
        data: dict[str, Any] = (await self.client.get(f"{self.fleet.urls[i]}/sim/state")).json()
        return data

    def items(self, outcome: str) -> float:
        return self.sidecar.metrics.registry.get_sample_value(
            "pd_sidecar_encode_items_total", {"outcome": outcome}) or 0.0

    async def chat(self, encoders: str | None, *urls: str, model: str = MODEL
                   ) -> httpx.Response:
        headers = {ENCODER_HEADER: encoders} if encoders is not None else {}
        content: list[dict[str, Any]] = [{"type": "text", "text": "describe"}]
        content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        return await self.client.post(f"{self.url}/v1/chat/completions", headers=headers,
                                      json={"model": model, "max_tokens": 4,
                                            "messages": [{"role": "user", "content": content}]})


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    """Decode (0, EC consumer), two encoders (1, 2, EC producers) and an encode server the
    pool does not list (3), sharing one EC folder; the sidecar in front of the decoder."""
    async with _stack(tmp_path) as s:
        yield s


@contextlib.asynccontextmanager
async def _stack(tmp_path: Path, ec_connector: str = "ec-example") -> AsyncIterator[Stack]:
    ec = tmp_path / "ec"

    def server(ip: str, name: str, role: str) -> ServerConfig:
        return ServerConfig(host=ip, port=0, name=name, profile=TINY,
                            ec_transfer=ECTransferConfig(role, ec))
    configs = [server(DECODE_IP, "decode", "ec_consumer"),
               server(ENC1_IP, "encode-1", "ec_producer"),
               server(ENC2_IP, "encode-2", "ec_producer"),
               server(STRANGER_IP, "stranger", "ec_producer")]
    async with start_fleet(configs) as fleet, httpx.AsyncClient(timeout=20) as client:
        manifests = tmp_path / "pool.yaml"
        write_manifests(manifests, fleet.ports, [
            _pod("decode", DECODE_IP, "decode"), _pod("encode-1", ENC1_IP, "encode"),
            _pod("encode-2", ENC2_IP, "encode")])
        datastore = Datastore()
        ManifestSource(manifests, datastore, pool_name="pd").load()
        sidecar = Sidecar(SidecarConfig(decoder_url=fleet.urls[0], prefill_timeout=2.0,
                                        ec_connector=ec_connector),
                          PoolPrefillers(datastore), SidecarMetrics())
        runner = web.AppRunner(sidecar.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield Stack(fleet, sidecar, f"http://127.0.0.1:{port}", client)
        finally:
            await runner.cleanup()


async def test_each_unique_item_is_encoded_on_an_encoder_and_loaded_by_the_decoder(
    stack: Stack,
) -> None:
    r = await stack.chat(f"{stack.addr(1)},{stack.addr(2)}",
                         "https://x/a.png", "https://x/b.png", "https://x/a.png")
    assert r.status_code == 200, r.text
    assert r.headers["x-inference-pod"] == "decode"
    assert stack.items("encoded") == 2  # a.png once
    assert [(await stack.state(i))["mm_encoded"] for i in (1, 2)] == [1, 1]  # round robin
    decode = await stack.state(0)
    assert (decode["mm_loaded"], decode["mm_encoded"]) == (2, 0)


async def test_without_the_header_or_without_images_nothing_is_encoded_elsewhere(
    stack: Stack,
) -> None:
    assert (await stack.chat(None, "https://x/a.png")).status_code == 200
    assert (await stack.chat(stack.addr(1))).status_code == 200  # text only
    assert stack.items("encoded") == 0
    assert (await stack.state(1))["finished"] == 0
    assert (await stack.state(0))["mm_encoded"] == 1  # the decoder encoded it itself


async def test_an_encoder_outside_the_pool_is_refused_and_the_decoder_encodes(
    stack: Stack,
) -> None:
    r = await stack.chat(stack.addr(3), "https://x/a.png")
    assert r.status_code == 200, r.text
    assert stack.items("rejected") == 1
    assert (await stack.state(3))["finished"] == 0
    assert (await stack.state(0))["mm_encoded"] == 1


async def test_a_dead_encoder_costs_no_client_error(stack: Stack) -> None:
    await stack.fleet.servers[1].kill()
    r = await stack.chat(stack.addr(1), "https://x/a.png")
    assert r.status_code == 200, r.text
    assert stack.items("unreachable") == 1
    assert (await stack.state(0))["mm_encoded"] == 1


async def test_an_encoders_client_error_goes_back_with_its_status(stack: Stack) -> None:
    r = await stack.chat(stack.addr(1), "https://x/a.png", model="no-such-model")
    assert r.status_code == 404, r.text
    assert (await stack.state(0))["finished"] == 0


async def test_without_an_ec_connector_the_header_is_ignored(tmp_path: Path) -> None:
    async with _stack(tmp_path, ec_connector="") as stack:
        r = await stack.chat(stack.addr(1), "https://x/a.png")
        assert r.status_code == 200, r.text
        assert (await stack.state(1))["finished"] == 0
        assert (await stack.state(0))["mm_encoded"] == 1


def test_the_ec_connector_flag_takes_llm_ds_names() -> None:
    bad = subprocess.run([sys.executable, "-m", "sidecar.main", "--ec-connector", "ec-nixl"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0
    assert "ec-nixl is llm-d's, not implemented" in bad.stderr
