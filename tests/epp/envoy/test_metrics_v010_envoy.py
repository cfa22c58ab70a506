"""llm-d-router v0.10's metric names, scraped from a running ``epp`` process's ``/metrics``
after requests through a real Envoy: every upstream name this EPP exports by default is there
with upstream's labels, beside its deprecated twin."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.picker import Pool

pytestmark = pytest.mark.envoy

UPSTREAM = yaml.safe_load((Path(__file__).parents[1] / "data" /
                           "llm-d-router-v0.10.0-metrics.yaml").read_text())["metrics"]
# Exported only when a plugin or an event makes them: a P/D handler, predicted latency, KV
# events, a failed scrape (tests/epp/unit/test_upstream_metrics.py covers them in-process).
NEEDS_MORE = ("_disagg_", "_pd_decision", "predicted", "prediction", "slo_violation",
              "inference_request_metric", "kv_cache_events", "datalayer_", "flow_control",
              "extproc", "inflight_", "encoder_cache", "program_aware", "disaggregatedset",
              "kv_cache_index", "request_ttft_seconds", "request_tpot_seconds",
              "prefix_indexer_size")


def scrape(pool: Pool) -> dict[str, set[frozenset[str]]]:
    text = httpx.get(f"http://127.0.0.1:{pool.epp.metrics}/metrics", timeout=5).text
    out: dict[str, set[frozenset[str]]] = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out[name] = {frozenset(k for k in s.labels if k != "le") for s in fam.samples
                     if not s.name.endswith("_created")}
    return out


def sample(pool: Pool, name: str, **labels: str) -> float:
    """The sum of ``name``'s series with ``labels`` (others, e.g. the target model a weighted
    rewrite picked at random, summed over)."""
    text = httpx.get(f"http://127.0.0.1:{pool.epp.metrics}/metrics", timeout=5).text
    return sum(float(s.value) for fam in text_string_to_metric_families(text)
               for s in fam.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_v010_names_are_served_on_the_metrics_port_with_their_labels(pool: Pool) -> None:
    for stream in (False, True):  # prompts long enough for prefix-cache blocks
        body = {"model": "food-review", "prompt": f"{uuid.uuid4()} " * 40, "stream": stream}
        r = httpx.post(pool.url(), content=orjson.dumps(body), timeout=10,
                       headers={"x-llm-d-inference-fairness-id": "tenant-a"})
        assert r.status_code == 200
    assert httpx.post(pool.url(), content=b"not json", timeout=10).status_code == 400
    served = scrape(pool)
    checked = 0
    for entry in UPSTREAM:
        name = entry["name"]
        if any(part in name for part in NEEDS_MORE):
            continue
        assert name in served, f"{name} is not on /metrics"
        assert frozenset(entry["labels"]) in served[name] or not entry["labels"], name
        checked += 1
    assert checked >= 45


def test_request_series_carry_the_fairness_id_and_the_streaming_label(pool: Pool) -> None:
    labels = {"model_name": "food-review", "fairness_id": "tenant-b", "priority": "0"}
    for stream in (False, True):
        body = {"model": "food-review", "prompt": f"unique {uuid.uuid4()}", "stream": stream}
        r = httpx.post(pool.url(), content=orjson.dumps(body), timeout=10,
                       headers={"x-gateway-inference-fairness-id": "tenant-b"})  # the old name
        assert r.status_code == 200
    for streaming in ("true", "false"):
        assert sum(sample(pool, "llm_d_epp_request_ttft_seconds_count", **labels,
                          target_model_name=t, streaming=streaming)
                   for t in ("food-review-v1", "food-review-v2")) == 1
    assert sum(sample(pool, "llm_d_epp_request_total", **labels, target_model_name=t)
               for t in ("food-review-v1", "food-review-v2")) == 2
    # the EPP's own time on each request and response was measured
    assert sample(pool, "llm_d_epp_request_processing_duration_seconds_count") >= 2
    assert sample(pool, "llm_d_epp_response_processing_duration_seconds_count") >= 2
    # and the rewrite was counted under both names
    assert sample(pool, "llm_d_epp_model_rewrite_decisions_total",
                  model_rewrite_name="food-review-split") >= 2
    assert sample(pool, "inference_extension_model_rewrite_decisions_total",
                  model_rewrite_name="food-review-split") >= 2
