"""BBR through a real Envoy, in BUFFERED and FULL_DUPLEX_STREAMED modes."""

from __future__ import annotations

import asyncio
import hashlib
import random
import time

import httpx
import orjson
import pytest
from prometheus_client import REGISTRY

from tests.support.bbr_gateway import MAX_BODY, UNICODE_MODEL, Gateway

pytestmark = pytest.mark.envoy

JSON = {"content-type": "application/json"}


def post(gw: Gateway, body: bytes, **kw: object) -> httpx.Response:
    return httpx.post(gw.url(), content=body, headers=JSON, timeout=30, **kw)  # type: ignore[arg-type]


def padded(model: str, size: int) -> bytes:
    """A JSON body naming ``model`` that is exactly ``size`` bytes long."""
    head = b'{"model":"' + model.encode() + b'","prompt":"'
    tail = b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


@pytest.mark.parametrize("model", ["a", "b"])
def test_model_selects_its_route_and_body_arrives_unchanged(gateway: Gateway, model: str) -> None:
    body = b'{"model": "' + model.encode() + b'", "prompt": "hi",  "n": 1}'
    r = post(gateway, body)
    assert r.status_code == 200
    seen = r.json()
    assert seen["backend"] == model
    assert seen["sha256"] == hashlib.sha256(body).hexdigest()
    assert seen["headers"]["x-gateway-model-name"] == model


@pytest.mark.parametrize(
    ("body", "code", "counter"),
    [
        (b'{"prompt": "no model here"}', "missing_model", "bbr_body_field_not_found_total"),
        (b'{"model": "", "prompt": "x"}', "missing_model", "bbr_body_field_empty_total"),
        (b'{"model": 5, "prompt": "x"}', "invalid_model", "bbr_body_field_not_found_total"),
        (b'{"model": null, "prompt": "x"}', "missing_model", "bbr_body_field_not_found_total"),
    ],
)
def test_request_without_a_usable_model_gets_400_json_and_is_counted(
        gateway: Gateway, body: bytes, code: str, counter: str) -> None:
    """What the EPP answers (docs/epp.md), answered at the gateway's front door, so the request
    never reaches a route that matches without the model header."""
    before = REGISTRY.get_sample_value(counter, {"field": "model"}) or 0
    errors = REGISTRY.get_sample_value("bbr_errors_total", {"code": "400"}) or 0
    r = post(gateway, body)
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"] == {"message": r.json()["error"]["message"],
                                 "type": "invalid_request_error", "code": code}
    assert REGISTRY.get_sample_value(counter, {"field": "model"}) == before + 1
    assert REGISTRY.get_sample_value("bbr_errors_total", {"code": "400"}) == errors + 1


def test_client_model_header_cannot_pick_the_route(gateway: Gateway) -> None:
    spoofed = {**JSON, "x-gateway-model-name": "b"}
    r = httpx.post(gateway.url(), content=b'{"model": "a"}', headers=spoofed)
    assert r.json()["backend"] == "a"
    r = httpx.post(gateway.url(), content=b'{"prompt": "x"}', headers=spoofed)
    assert r.status_code == 400


def test_unicode_model_name_routes(gateway: Gateway) -> None:
    r = post(gateway, orjson.dumps({"model": UNICODE_MODEL, "prompt": "x"}))
    assert r.status_code == 200
    assert r.json()["backend"] == "b"


def test_adapter_gets_its_base_model_header(gateway: Gateway) -> None:
    r = post(gateway, b'{"model": "food-review", "prompt": "x"}')
    assert r.json()["headers"]["x-gateway-base-model-name"] == "a"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"model": "a", ', "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b'"just a string"', "invalid_json"),
        (b"{", "invalid_json"),  # the 1-byte body
    ],
)
def test_non_object_body_gets_400_json_error(gateway: Gateway, body: bytes, code: str) -> None:
    r = post(gateway, body)
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == code
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_empty_body_passes_to_default_route(gateway: Gateway) -> None:
    r = post(gateway, b"")
    assert r.status_code == 200
    assert r.json()["backend"] == "default"
    assert r.json()["length"] == 0


def test_headers_only_request_passes_through(gateway: Gateway) -> None:
    r = httpx.get(gateway.url("/v1/files"))
    assert r.status_code == 200
    assert r.json()["method"] == "GET"
    assert r.json()["backend"] == "default"


@pytest.mark.parametrize("size", [61_999, 62_000, 62_001, 5 * 1024 * 1024])
def test_body_sizes_around_the_chunk_limit_arrive_whole(gateway: Gateway, size: int) -> None:
    body = padded("a", size)

    def chunks() -> object:
        for off in range(0, len(body), 16_384):  # many chunks on the wire
            yield body[off : off + 16_384]

    r = httpx.post(gateway.url(), content=chunks(), headers=JSON, timeout=60)  # type: ignore[arg-type]
    assert r.status_code == 200
    assert r.json()["backend"] == "a"
    assert r.json()["length"] == size
    assert r.json()["sha256"] == hashlib.sha256(body).hexdigest()


def test_body_over_the_cap_gets_413(gateway: Gateway) -> None:
    r = post(gateway, padded("a", MAX_BODY + 1))
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_sse_response_streams_unbuffered(gateway: Gateway) -> None:
    start = time.monotonic()
    with httpx.stream("POST", gateway.url("/sse?n=5&delay=0.3"), headers=JSON,
                      content=b'{"model": "a", "stream": true, "prompt": "x"}') as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        first_at = time.monotonic() - start
        rest = [line for line in lines if line.startswith("data:")]
    total = time.monotonic() - start
    assert first == 'data: {"i": 0}'
    assert rest[-1] == "data: [DONE]"
    assert total >= 1.4  # the backend spaces 5 events 0.3 s apart
    assert first_at < total / 2


def test_200_concurrent_requests_each_reach_their_model(gateway: Gateway) -> None:
    rng = random.Random(7)
    models = [rng.choice("ab") for _ in range(200)]

    async def run() -> list[tuple[str, str]]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:

            async def one(i: int, m: str) -> tuple[str, str]:
                body = orjson.dumps({"model": m, "prompt": f"request {i}"})
                r = await client.post(gateway.url(), content=body, headers=JSON)
                return m, r.json()["backend"]

            return await asyncio.gather(*(one(i, m) for i, m in enumerate(models)))

    results = asyncio.run(run())
    assert len(results) == 200
    assert all(want == got for want, got in results)


MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/messages", {"model": "b", "max_tokens": 5, "messages": MESSAGES}),
    ("/v1/messages/count_tokens", {"model": "b", "messages": MESSAGES}),
    ("/inference/v1/generate", {"model": "b", "token_ids": [1, 2],
                                "sampling_params": {"max_tokens": 2}}),
    ("/generate", {"model": "b", "input_ids": [1, 2]}),
])
def test_native_protocol_bodies_route_by_their_model(gateway: Gateway, path: str,
                                                     body: dict) -> None:
    r = httpx.post(gateway.url(path), json=body, timeout=30)
    assert r.status_code == 200
    assert r.json()["backend"] == "b"
    assert r.json()["headers"]["x-gateway-model-name"] == "b"


def test_anthropic_path_errors_come_in_anthropics_envelope(gateway: Gateway) -> None:
    r = httpx.post(gateway.url("/v1/messages"), json={"max_tokens": 5, "messages": MESSAGES},
                   timeout=30)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert r.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": r.json()["error"]["message"],
        "code": "missing_model"}}


def test_sglang_body_without_model_is_a_400_at_the_front_door(gateway: Gateway) -> None:
    """SGLang's native body names no model: no pool can be chosen (docs/protocols.md)."""
    r = httpx.post(gateway.url("/generate"), json={"text": "hi"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_model"
