"""Large multimodal payloads through the real Envoy + BBR + EPP (issue 29, item 3): with the
body cap raised for images (``--max-body-bytes 32MiB`` on both services, as
docs/kubernetes.md section 5c says for multimodal pools), a 25 MB chat request with base64 images
reaches the model server byte for byte, a 100 MB one gets the JSON 413, and the gateway
serves the next request. BUFFERED sends the 25 MB body to each service as ONE gRPC message,
so it also proves the message-size limits follow the cap; FULL_DUPLEX_STREAMED sends chunks.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import httpx
import orjson
import pytest

from devkit import envoy as e
from devkit.reliability.gateway import PoolDef, start_gateway
from tests.support.processes import BackgroundLoop, FakeModelServer

pytestmark = pytest.mark.envoy

CAP = 32 << 20


def chat_with_images(size: int) -> bytes:
    """An OpenAI chat request of ``size`` bytes (to within a few hundred): a question and
    four base64 PNG data URLs of random (incompressible) bytes."""
    per_image = (size - 400) // 4 * 3 // 4  # raw bytes whose base64 fills a quarter
    content: list[dict[str, object]] = [{"type": "text", "text": "What is in these images?"}]
    for _ in range(4):
        data = base64.b64encode(os.urandom(per_image)).decode()
        content.append({"type": "image_url",
                        "image_url": {"url": f"data:image/png;base64,{data}"}})
    return orjson.dumps({"model": "m", "max_tokens": 8,
                         "messages": [{"role": "user", "content": content}]})


def images_digest(body: dict[str, object]) -> str:
    h = hashlib.sha256()
    for part in body["messages"][0]["content"][1:]:  # type: ignore[index]
        h.update(part["image_url"]["url"].encode())
    return h.hexdigest()


def oversized_chat(size: int) -> bytes:
    """A chat request of ``size`` bytes, one image; the content never gets looked at."""
    head = b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", ' \
           b'"image_url": {"url": "data:image/png;base64,'
    tail = b'"}}]}]}'
    return head + b"A" * (size - len(head) - len(tail)) + tail


@pytest.mark.parametrize("mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
def test_25mb_of_images_reach_the_server_and_100mb_gets_the_json_413(
        bg: BackgroundLoop, tmp_path: Path, mode: str) -> None:
    """Streamed, the services hold the cap (413 after 32 MiB of the 100 MB); BUFFERED, Envoy's
    buffer answers first (its JSON 413: test_large_bodies.py), so only 25 MB goes there."""
    port = e.free_port()
    server = bg.run(FakeModelServer("p0", "127.0.24.1", port).start())
    server.model = "m"
    cap = ("--max-body-bytes", "32MiB")
    # BUFFERED: Envoy must hold the whole body too (the gateway's buffer limit, per gateway
    # in docs/kubernetes.md 5c); streamed: Envoy's 1 MiB default stays.
    gw = start_gateway(tmp_path, [PoolDef("p", ["m"], [("p0", server.host)], port)],
                       mode=mode, bbr_args=cap, epp_args=cap,
                       buffer_limit=CAP + (1 << 20) if mode == "BUFFERED" else None)
    try:
        with httpx.Client(timeout=60) as client:
            big = chat_with_images(25_000_000)
            r = client.post(gw.url("/v1/chat/completions"), content=big,
                            headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text[:300]
            [seen] = server.requests
            assert images_digest(seen["body"]) == images_digest(orjson.loads(big))
            del big, seen
            server.requests.clear()

            if mode == "FULL_DUPLEX_STREAMED":
                r = client.post(gw.url("/v1/chat/completions"),
                                content=oversized_chat(100_000_000),
                                headers={"content-type": "application/json"})
                assert r.status_code == 413, r.text[:300]
                assert r.headers["content-type"] == "application/json"
                assert r.json()["error"]["code"] == "request_too_large"
                assert server.requests == []

            small = client.post(gw.url("/v1/chat/completions"), content=orjson.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            assert small.status_code == 200, small.text
        for svc in (gw.bbr, *gw.epps.values()):
            assert svc.proc is not None and svc.proc.poll() is None, "a service died"
    finally:
        gw.stop()
        bg.run(server.stop())
