"""Requests the gateway cannot route, through the real Envoy and BBR: OpenAI-shaped JSON
errors with the right status and ``content-type: application/json``, never Envoy's text."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.support.bbr_gateway import Gateway, start_gateway
from tests.support.processes import BackgroundLoop, EchoBackend

JSON = {"content-type": "application/json"}
NOT_FOUND = "no pool serves this model"


@pytest.fixture(scope="module", params=["BUFFERED", "FULL_DUPLEX_STREAMED"])
def strict(request: pytest.FixtureRequest, bg: BackgroundLoop,
           backends: dict[str, EchoBackend]) -> Iterator[Gateway]:
    """No default route: a model no pool serves gets the gateway's 404."""
    gw, svc = start_gateway(bg, request.param, backends, not_found=NOT_FOUND)
    yield gw
    gw.envoy.stop()
    svc.stop()


@pytest.fixture(scope="module")
def lenient(bg: BackgroundLoop, backends: dict[str, EchoBackend]) -> Iterator[Gateway]:
    """``bbr --require-model=false``: upstream's pass-through to the default route."""
    gw, svc = start_gateway(bg, "FULL_DUPLEX_STREAMED", backends, require_model=False)
    yield gw
    gw.envoy.stop()
    svc.stop()


@pytest.mark.parametrize("model", ["gpt-unknown", 'quote"and\\slash', "modèle-日本語-x"])
def test_unknown_model_gets_404_json_naming_it(strict: Gateway, model: str) -> None:
    r = httpx.post(strict.url(), content=orjson.dumps({"model": model, "prompt": "x"}),
                   headers=JSON)
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{NOT_FOUND}: {model}; known models: a, b")


@pytest.mark.parametrize(
    ("body", "code"),
    [(b'{"prompt": "x"}', "missing_model"), (b'{"model": "", "prompt": "x"}', "missing_model"),
     (b'{"model": ["a"], "prompt": "x"}', "invalid_model"), (b"{not json", "invalid_json")],
)
def test_unroutable_body_gets_400_json(strict: Gateway, body: bytes, code: str) -> None:
    r = httpx.post(strict.url("/v1/chat/completions"), content=body, headers=JSON)
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == code


def test_a_path_no_route_serves_gets_404_json(strict: Gateway) -> None:
    r = httpx.get(strict.url("/nothing/here"))
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "model_not_found"


def test_require_model_false_passes_on_to_the_default_route(lenient: Gateway) -> None:
    for body in (b'{"prompt": "no model here"}', b'{"model": "", "prompt": "x"}',
                 b'{"model": 5, "prompt": "x"}'):
        r = httpx.post(lenient.url(), content=body, headers=JSON)
        assert r.status_code == 200, body
        assert r.json()["backend"] == "default"
        assert "x-gateway-model-name" not in r.json()["headers"]
