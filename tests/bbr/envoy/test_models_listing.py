"""``GET /v1/models`` answered by BBR at the gateway (through a real Envoy, both body modes):
the union of the base models and adapters BBR's mappings name, shaped like vLLM's listing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from bbr.basemodels import StaticBaseModels
from bbr.models import ModelListing
from shared.errors import DirectResponse, NotFound
from tests.support.bbr_gateway import Gateway, start_gateway
from tests.support.processes import BackgroundLoop, EchoBackend

pytestmark = pytest.mark.envoy

# Two pools' worth: Llama with one adapter, Qwen with two adapter versions and the rewrite
# name clients use for them.
MAPPING = {
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "food-review": "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B-Instruct",
    "sql-lora": "Qwen/Qwen2.5-7B-Instruct",
    "sql-lora-v1": "Qwen/Qwen2.5-7B-Instruct",
    "sql-lora-v2": "Qwen/Qwen2.5-7B-Instruct",
}


@pytest.fixture(scope="module", params=["BUFFERED", "FULL_DUPLEX_STREAMED"])
def gateway(request: pytest.FixtureRequest, bg: BackgroundLoop,
            backends: dict[str, EchoBackend]) -> Iterator[Gateway]:
    gw, svc = start_gateway(bg, request.param, backends, StaticBaseModels(MAPPING))
    yield gw
    gw.envoy.stop()
    svc.stop()


def test_listing_is_the_union_of_base_models_and_adapters(gateway: Gateway) -> None:
    r = httpx.get(gateway.url("/v1/models"))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["object"] == "list"
    by_id = {m["id"]: m for m in body["data"]}
    assert set(by_id) == set(MAPPING)
    assert by_id["Qwen/Qwen2.5-7B-Instruct"]["parent"] is None
    assert by_id["sql-lora"]["parent"] == "Qwen/Qwen2.5-7B-Instruct"
    assert by_id["food-review"]["parent"] == "meta-llama/Llama-3.1-8B-Instruct"
    for entry in body["data"]:
        assert entry["object"] == "model" and entry["created"] == 1700000000
    # vLLM's order: each base model, then its adapters.
    ids = [m["id"] for m in body["data"]]
    assert ids.index("meta-llama/Llama-3.1-8B-Instruct") < ids.index("food-review")


def test_listing_never_reaches_a_backend(gateway: Gateway) -> None:
    before = {n: b.requests for n, b in gateway.backends.items()}
    assert httpx.get(gateway.url("/v1/models?limit=5")).status_code == 200
    assert {n: b.requests for n, b in gateway.backends.items()} == before


def test_one_model_by_id_including_slashes(gateway: Gateway) -> None:
    r = httpx.get(gateway.url("/v1/models/Qwen/Qwen2.5-7B-Instruct"))
    assert r.status_code == 200
    assert r.json()["id"] == "Qwen/Qwen2.5-7B-Instruct" and r.json()["parent"] is None
    r = httpx.get(gateway.url("/v1/models/sql-lora"))
    assert r.json()["parent"] == "Qwen/Qwen2.5-7B-Instruct"


def test_unknown_model_by_id_is_a_404_openai_error(gateway: Gateway) -> None:
    r = httpx.get(gateway.url("/v1/models/no-such-model"))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert "no-such-model" in r.json()["error"]["message"]


def test_inference_requests_still_route(gateway: Gateway) -> None:
    r = httpx.post(gateway.url(), content=orjson.dumps({"model": "a", "prompt": "x"}))
    assert r.status_code == 200 and r.json()["backend"] == "a"


def test_empty_mapping_passes_the_request_on(bg: BackgroundLoop,
                                             backends: dict[str, EchoBackend]) -> None:
    gw, svc = start_gateway(bg, "FULL_DUPLEX_STREAMED", backends, StaticBaseModels())
    try:
        r = httpx.get(gw.url("/v1/models"))
        assert r.status_code == 200 and r.json()["backend"] == "default"
    finally:
        gw.envoy.stop()
        svc.stop()


def test_models_endpoint_off_passes_the_request_on(bg: BackgroundLoop,
                                                   backends: dict[str, EchoBackend]) -> None:
    gw, svc = start_gateway(bg, "BUFFERED", backends, StaticBaseModels(MAPPING),
                            models_endpoint=False)
    try:
        r = httpx.get(gw.url("/v1/models"))
        assert r.status_code == 200 and r.json()["backend"] == "default"
    finally:
        gw.envoy.stop()
        svc.stop()


def test_listing_follows_mapping_updates() -> None:
    models = StaticBaseModels({"a": "a"})
    listing = ModelListing(models, created=1)
    with pytest.raises(DirectResponse) as first:
        listing.answer("GET", "/v1/models")
    assert [m["id"] for m in orjson.loads(first.value.payload)["data"]] == ["a"]
    models.replace({"b": "b", "b-lora": "b"})  # a ConfigMap edit replaces the mapping whole
    with pytest.raises(DirectResponse) as second:
        listing.answer("GET", "/v1/models")
    assert [m["id"] for m in orjson.loads(second.value.payload)["data"]] == ["b", "b-lora"]
    with pytest.raises(NotFound):
        listing.answer("GET", "/v1/models/a")


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/models"), ("GET", "/v1/modelsx"), ("GET", "/v1/chat/completions"),
    ("GET", "/models")])
def test_other_requests_are_not_answered(method: str, path: str) -> None:
    listing = ModelListing(StaticBaseModels({"a": "a"}))
    # The control: this listing does answer the listing request (a listing that answered
    # nothing would pass the check below; issue 31, item 12) ...
    with pytest.raises(DirectResponse):
        listing.answer("GET", "/v1/models")
    # ... and lets every other request through to the pool, untouched.
    assert listing.answer(method, path) is None
