"""Hostile request bodies through the real Envoy, BBR and both EPPs: each gets a 200 or a
JSON 4xx, never a 5xx or a hang, and every service stays healthy with nothing in flight."""

from __future__ import annotations

import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from tests.support.two_pools import LLAMA, TwoPools

pytestmark = pytest.mark.envoy

HOSTILE_BODIES = 200


def hostile_body(rng: random.Random) -> bytes:
    """A body from one of the classes a hostile client sends."""
    model = rng.choice([*LLAMA, "qwen-7b", "a\x00b", "a\nb", "m" * 70_000, "modèle", ""])
    valid = orjson.dumps({"model": model, "prompt": "hello", "max_tokens": 3})
    kind = rng.randrange(10)
    if kind == 0:
        n = rng.choice([10, 254, 256, 1000, 1100, 5000])
        return b'{"model":"llama-8b","prompt":' + b"[" * n + b"]" * n + b"}"
    if kind == 1:
        return valid[: rng.randrange(len(valid))]
    if kind == 2:
        return b'{"model":"llama-8b","prompt":"\xff\xfe' + rng.randbytes(8) + b'"}'
    if kind == 3:
        return orjson.dumps({"model": rng.choice([1, 1.5, None, [], {}, True]), "prompt": 1})
    if kind == 4:
        return b'{"model":"qwen-7b","prompt":"x","model":"llama-8b","model":5}'
    if kind == 5:
        return rng.randbytes(rng.randrange(1, 200))
    if kind == 6:
        return orjson.dumps({"model": "llama-8b", "prompt": "x" * rng.choice(
            [1 << 20, (10 << 20) + 1])})
    if kind == 7:
        return orjson.dumps({"model": "llama-8b", "messages": rng.choice(
            ["text", 5, None, [{"role": "user", "content": "hi"}]])})
    if kind == 8:
        return orjson.dumps({"model": "llama-8b", "prompt": "x", "n": 1e300,
                             "cache_salt": [1, 2]})
    return valid


def test_hostile_bodies_get_a_200_or_a_json_4xx_and_services_stay_healthy(
        two_pools: TwoPools) -> None:
    tp = two_pools
    rng = random.Random(f"bodies-{tp.gateway.mode}")
    bodies = [hostile_body(rng) for _ in range(HOSTILE_BODIES)]
    paths = ["/v1/completions", "/v1/chat/completions"]

    def send(i: int) -> tuple[int, bytes, float]:
        start = time.monotonic()
        r = httpx.post(tp.gateway.url(paths[i % 2]), content=bodies[i], timeout=15)
        return r.status_code, r.content, time.monotonic() - start

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(send, range(HOSTILE_BODIES)))
    statuses = Counter(s for s, _, _ in results)
    assert set(statuses) <= {200, 400, 404, 413}, statuses
    for status, content, _ in results:
        if status != 200:
            assert set(orjson.loads(content)["error"]) >= {"message", "type", "code"}
    assert max(t for _, _, t in results) < 10
    assert tp.gateway.bbr.serving()
    for epp in tp.gateway.epps.values():
        assert epp.serving()
        pool = orjson.loads(epp.get("/debug/pool")[1])
        assert [ep["inflight_requests"] for ep in pool["endpoints"]] == [0, 0]


@pytest.mark.parametrize("model", ["llama-8b\x00", "llama\n-8b", "\x7f", "m" * 70_000])
def test_model_no_header_can_carry_gets_a_json_404_not_a_500(two_pools: TwoPools,
                                                             model: str) -> None:
    r = httpx.post(two_pools.gateway.url(), content=orjson.dumps({"model": model,
                                                                  "prompt": "x"}))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
