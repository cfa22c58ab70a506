"""Spoofing / SSRF through the real Envoy: no client header or body ever moves a request
outside the pool its route selected, in either body mode.

1,000 hostile requests per mode mix control headers in every case and repetition, comma
lists, other pools' model names in headers versus the body, duplicate JSON keys, unicode and
header-only requests. A canary HTTP server and a canary "pod" on the pools' port sit outside
both pools and must see nothing.
"""

from __future__ import annotations

import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import orjson
import pytest

from tests.support.two_pools import LLAMA, QWEN, TwoPools

pytestmark = pytest.mark.envoy

HOSTILE_REQUESTS = 1000
CONTROL = ["x-gateway-destination-endpoint", "x-gateway-destination-endpoint-subset",
           "x-gateway-destination-endpoint-served", "x-gateway-destination-endpoint-fallback",
           "x-gateway-model-name", "x-gateway-base-model-name", "x-gateway-model-name-rewrite",
           "x-gateway-inference-objective", "x-request-id", "x-envoy-original-dst-host",
           "x-forwarded-host", "x-envoy-internal"]
MODELS = [*LLAMA, *QWEN, "LLAMA-8B", "llama-8b ", " qwen-7b", "qwen-7b\u0000", "\uff51wen-7b",
          "llama-8b,qwen-7b", "unknown", ""]


@dataclass(frozen=True)
class Hostile:
    """One hostile request and the pool it may legitimately reach (None: no pool)."""

    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    pool: str | None


def _case(name: str, rng: random.Random) -> str:
    return rng.choice([name, name.upper(), name.title(), "".join(
        c.upper() if rng.random() < 0.5 else c for c in name)])


def _targets(tp: TwoPools, rng: random.Random) -> list[str]:
    canaries = [tp.canary_pod.key, f"127.0.0.1:{tp.canary_http.port}"]
    pods = [s.key for ss in tp.servers.values() for s in ss]
    one = rng.choice(canaries + pods)
    return [one, f"{one},{rng.choice(canaries)}", f"{rng.choice(pods)},{one}",
            f" {one} ", f"[{one}]", f'["{one}"]', f"localhost:{tp.canary_http.port}",
            f"2130706433:{tp.canary_http.port}", one + "\u00e9"]


def hostile(tp: TwoPools, rng: random.Random) -> Hostile:
    """One request mixing control headers, model names and bodies at random."""
    headers: list[tuple[bytes, bytes]] = []
    for _ in range(rng.randint(0, 6)):
        name = rng.choice(CONTROL)
        # Values an HTTP client can send (Envoy itself answers 400 to the rest).
        value = rng.choice([v for v in _targets(tp, rng) + MODELS
                            if v == v.strip() and "\x00" not in v])
        for _ in range(rng.choice([1, 1, 2, 3])):  # duplicates
            headers.append((_case(name, rng).encode(), value.encode("utf-8")))
    kind = rng.choice(["object", "object", "duplicate_model", "no_model", "not_json", "get"])
    model = rng.choice(MODELS)
    prompt = rng.choice(["hi", "x" * 500, "模型 ünïcödé", "\\u0000"])
    body = b""
    if kind == "object":
        body = orjson.dumps({"model": model, "prompt": prompt})
    elif kind == "duplicate_model":
        other = rng.choice(MODELS)
        body = b'{"model":' + orjson.dumps(other) + b',"prompt":"p","model":' + orjson.dumps(
            model) + b"}"
    elif kind == "no_model":
        body = orjson.dumps({"prompt": prompt, "models": model})
    elif kind == "not_json":
        body = b"model=" + model.encode()
    body_model = model if kind in ("object", "duplicate_model") else None
    pool = next((p for p, names in (("llama", LLAMA), ("qwen", QWEN))
                 if body_model in names), None)
    return Hostile("GET" if kind == "get" else "POST",
                   rng.choice(["/v1/completions", "/v1/chat/completions", "/v1/models"]),
                   headers, body, pool)


def send(client: httpx.Client, tp: TwoPools, h: Hostile) -> tuple[Hostile, int, str]:
    """(request, status, serving pod or "")."""
    try:
        r = client.request(h.method, tp.gateway.url(h.path), headers=h.headers,
                           content=h.body or None)
    except httpx.HTTPError:
        return h, 0, ""
    return h, r.status_code, r.headers.get("x-inference-pod", "")


def test_no_hostile_request_leaves_the_pool_its_route_selected(two_pools: TwoPools) -> None:
    tp = two_pools
    tp.reset()
    before = (tp.canary_http.requests, len(tp.canary_pod.requests))
    rng = random.Random(f"spoof-{tp.gateway.mode}")
    cases = [hostile(tp, rng) for _ in range(HOSTILE_REQUESTS)]
    with httpx.Client(timeout=10) as client, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda h: send(client, tp, h), cases))

    escaped = [(h, status, pod) for h, status, pod in results
               if pod and (h.pool is None or tp.pool_of(pod) != h.pool)]
    assert escaped == [], escaped[:3]
    assert (tp.canary_http.requests, len(tp.canary_pod.requests)) == before
    statuses = Counter(status for _, status, _ in results)
    assert statuses[0] == 0 and not any(s >= 500 for s in statuses), statuses
    assert statuses[200] > 50, statuses  # the legitimate share got through
    # Every request a server saw names that server, once, as its destination.
    for ss in tp.servers.values():
        for s in ss:
            assert {r["headers"].get("x-gateway-destination-endpoint")
                    for r in s.requests} <= {s.key}


def test_other_pools_model_in_the_header_does_not_change_the_pool(two_pools: TwoPools) -> None:
    tp = two_pools
    r = httpx.post(tp.gateway.url(), headers={"x-gateway-model-name": QWEN[0]},
                   content=orjson.dumps({"model": LLAMA[0], "prompt": "x"}))
    assert r.status_code == 200
    assert tp.pool_of(r.headers["x-inference-pod"]) == "llama"


def test_model_name_header_without_a_body_model_reaches_no_pool(two_pools: TwoPools) -> None:
    tp = two_pools
    r = httpx.post(tp.gateway.url(), headers={"x-gateway-model-name": QWEN[0]},
                   content=orjson.dumps({"prompt": "x"}))
    assert r.status_code == 400  # BBR: missing_model
    assert r.json()["error"]["code"] == "missing_model"
    assert "x-inference-pod" not in r.headers


def test_destination_header_naming_the_canary_is_overwritten(two_pools: TwoPools) -> None:
    tp = two_pools
    before = len(tp.canary_pod.requests)
    r = httpx.post(tp.gateway.url(), headers=[
        ("x-gateway-destination-endpoint", tp.canary_pod.key),
        ("X-Gateway-Destination-Endpoint", tp.canary_pod.key)],
        content=orjson.dumps({"model": LLAMA[0], "prompt": "x"}))
    assert r.status_code == 200
    assert tp.pool_of(r.headers["x-inference-pod"]) == "llama"
    assert len(tp.canary_pod.requests) == before
