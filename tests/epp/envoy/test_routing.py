"""The EPP picks endpoints through a real Envoy (FULL_DUPLEX_STREAMED, as upstream runs it)."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import httpx
import orjson
import pytest

from epp.metrics.scraper import MAX_BACKOFF
from tests.support.picker import Pool

pytestmark = pytest.mark.envoy

SCRAPE_SETTLE = 0.4  # several 50 ms scrape intervals
STALENESS = 2.0  # the EPP's default --metrics-staleness-threshold


def complete(pool: Pool, model: str = "base-model", prompt: str | None = None,
             headers: dict[str, str] | None = None, **extra: object) -> httpx.Response:
    body = {"model": model, "prompt": prompt or f"unique {uuid.uuid4()}", **extra}
    return httpx.post(pool.url(), content=orjson.dumps(body), headers=headers, timeout=10)


def test_requests_land_only_on_pool_endpoints_and_header_equals_metadata(pool: Pool) -> None:
    keys = {s.key for s in pool.servers}
    for _ in range(30):
        r = complete(pool)
        assert r.status_code == 200
        seen = r.json()["seen_headers"]
        assert seen["x-gateway-destination-endpoint"] in keys
        assert seen["x-lb-metadata"] == seen["x-gateway-destination-endpoint"]
        assert pool.by_key(seen["x-gateway-destination-endpoint"]).name == r.json()["served_by"]


def test_spoofed_destination_header_is_ignored(pool: Pool) -> None:
    outsider = "127.0.0.1:1"
    for _ in range(10):
        r = complete(pool, headers={
            "x-gateway-destination-endpoint": outsider,
            "x-gateway-destination-endpoint-subset": outsider,
            "x-gateway-destination-endpoint-served": outsider,
        })
        assert r.status_code == 200
        seen = r.json()["seen_headers"]
        assert seen["x-gateway-destination-endpoint"] != outsider
        assert "x-gateway-destination-endpoint-subset" not in seen
        assert "x-gateway-destination-endpoint-served" not in seen


def test_rewrite_splits_70_30_and_each_side_sees_its_own_model(pool: Pool) -> None:
    before = sum(len(s.requests) for s in pool.servers)
    with httpx.Client(timeout=10) as client:
        for i in range(1000):
            body = orjson.dumps({"model": "food-review", "prompt": f"p{i}"})
            r = client.post(pool.url(), content=body)
            assert r.status_code == 200
            assert r.json()["model"] == "food-review"  # the client's own name comes back
    assert sum(len(s.requests) for s in pool.servers) == before + 1000
    counts = Counter(req["body"]["model"] for s in pool.servers for req in s.requests)
    total = counts["food-review-v1"] + counts["food-review-v2"]
    assert total == 1000
    assert abs(counts["food-review-v1"] / total - 0.70) <= 0.05


def test_streamed_response_model_is_rewritten_back_and_not_buffered(pool: Pool) -> None:
    for s in pool.servers:
        s.stream_delay = 0.3
    try:
        start = time.monotonic()
        body = orjson.dumps({"model": "food-review", "prompt": "x", "stream": True})
        with httpx.stream("POST", pool.url(), content=body, timeout=10) as r:
            lines = (line for line in r.iter_lines() if line.startswith("data:"))
            first = orjson.loads(next(lines)[5:])
            first_at = time.monotonic() - start
            rest = list(lines)
        total = time.monotonic() - start
    finally:
        for s in pool.servers:
            s.stream_delay = 0.05
    assert first["model"] == "food-review"
    assert rest[-1] == "data: [DONE]"
    assert orjson.loads(rest[-2][5:])["model"] == "food-review"
    assert total >= 0.9
    assert first_at < total / 2


def wait_scrapes() -> None:
    time.sleep(SCRAPE_SETTLE)


def picks(pool: Pool, n: int, **kw: object) -> Counter[str]:
    return Counter(complete(pool, **kw).json()["served_by"] for _ in range(n))  # type: ignore[arg-type]


def test_shortest_queue_wins(pool: Pool) -> None:
    a, b, c = pool.servers
    a.waiting, b.waiting, c.waiting = 20, 0, 20
    wait_scrapes()
    assert picks(pool, 10) == Counter({b.name: 10})


def test_lowest_kv_cache_use_wins(pool: Pool) -> None:
    a, b, c = pool.servers
    a.kv, b.kv, c.kv = 0.9, 0.9, 0.1
    wait_scrapes()
    assert picks(pool, 10) == Counter({c.name: 10})


def test_server_with_the_adapter_loaded_wins(pool: Pool) -> None:
    a, b, c = pool.servers
    a.running_loras = ["sql-lora"]
    b.max_lora = c.max_lora = 1
    b.running_loras, c.running_loras = ["other"], ["other"]
    wait_scrapes()
    try:
        assert picks(pool, 10, model="sql-lora") == Counter({a.name: 10})
    finally:
        b.max_lora = c.max_lora = 4


def test_shared_prefix_sticks_to_one_server(pool: Pool) -> None:
    prefix = "You are a careful assistant. " * 80
    served = [complete(pool, prompt=prefix + f"question {i}").json()["served_by"]
              for i in range(8)]
    assert len(set(served)) == 1


def test_failing_metrics_leave_an_endpoint_on_its_last_metrics_until_they_go_stale(
        pool: Pool) -> None:
    a, b, c = pool.servers
    b.waiting = c.waiting = 30
    wait_scrapes()
    a.metrics_status = 500
    wait_scrapes()
    assert picks(pool, 5) == Counter({a.name: 5})  # its last page: an empty queue
    time.sleep(STALENESS + 0.3)  # past the EPP's 2 s staleness: fresh servers preferred
    assert a.name not in picks(pool, 10)
    a.metrics_status = 200
    time.sleep(MAX_BACKOFF + SCRAPE_SETTLE)  # its scrapes back off to one a second
    assert picks(pool, 5) == Counter({a.name: 5})


def test_sheddable_gets_429_when_saturated_while_critical_is_served(pool: Pool) -> None:
    for s in pool.servers:
        s.waiting = 10  # queue/5 = 2: saturated
    wait_scrapes()
    shed = complete(pool, headers={"x-gateway-inference-objective": "batch"})
    assert shed.status_code == 429
    assert shed.json()["error"]["code"] == "shed"
    critical = complete(pool, headers={"x-gateway-inference-objective": "chat"})
    assert critical.status_code == 200


def test_sheddable_is_served_when_the_pool_has_room(pool: Pool) -> None:
    wait_scrapes()
    r = complete(pool, headers={"x-gateway-inference-objective": "batch"})
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("body", "code"),
    [(b"{not json", "invalid_json"), (b'{"prompt": "x"}', "missing_model"),
     (b'{"model": 3, "prompt": "x"}', "invalid_model"), (b'{"model": "m"}', "invalid_body")],
)
def test_unroutable_body_gets_400_json_error(pool: Pool, body: bytes, code: str) -> None:
    r = httpx.post(pool.url(), content=body)
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == code


def test_model_rewrite_header_forces_the_target(pool: Pool) -> None:
    r = complete(pool, model="food-review", headers={"x-gateway-model-name-rewrite": "forced"})
    assert r.status_code == 200
    served = pool.by_key(r.json()["seen_headers"]["x-gateway-destination-endpoint"])
    assert served.requests[-1]["body"]["model"] == "forced"
    assert r.json()["model"] == "food-review"


def test_metrics_port_exports_upstream_names_and_debug_pool(pool: Pool) -> None:
    complete(pool)
    text = httpx.get(f"http://127.0.0.1:{pool.epp.metrics}/metrics").text
    for name in ("inference_objective_request_total", "inference_pool_ready_pods",
                 "inference_extension_scheduler_e2e_duration_seconds",
                 "inference_pool_average_kv_cache_utilization",
                 "inference_objective_input_tokens"):
        assert name in text
    debug = httpx.get(f"http://127.0.0.1:{pool.epp.metrics}/debug/pool").json()
    assert {ep["address"] for ep in debug["endpoints"]} == {s.key for s in pool.servers}
    assert all(ep["age_seconds"] is not None for ep in debug["endpoints"])
    # What the scraper read: the fake servers report LoRA slots but no cache config.
    assert all(ep["max_lora"] == 4 for ep in debug["endpoints"])
    assert all(ep["block_size"] is None and ep["num_gpu_blocks"] is None
               for ep in debug["endpoints"])
    # No precise prefix scorer here: no KV-event index to report from.
    assert all(ep["kv_cached_blocks"] is None for ep in debug["endpoints"])
