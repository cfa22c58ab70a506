"""TTFT and TPOT per request reach upstream's series through the real director and the
``request-metrics-recorder`` (streamed and not)."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from tests.epp.unit.test_director import HEADERS, body, director

LABELS = {"model_name": "m", "target_model_name": "m"}


def sample(name: str, **extra: str) -> float:
    return REGISTRY.get_sample_value(name, {**LABELS, **extra}) or 0.0


def test_a_streamed_response_records_its_ttft_and_tpot() -> None:
    d = director()
    ttft_n, tpot_n = (sample("inference_objective_request_ttft_seconds_count"),
                      sample("inference_objective_request_tpot_seconds_count"))
    ttft_sum = sample("inference_objective_request_ttft_seconds_sum")
    _, routed = d.route(HEADERS, body(), {})
    d.response_received(routed, 200, {"content-type": "text/event-stream"})
    d.response_chunk(routed, b'data: {"choices":[{"text":"a"}]}\n\n', True)
    d.finish(routed, completed=True, status=200, response_size=5, prompt_tokens=7,
             completion_tokens=5)
    r = routed.response
    assert sample("inference_objective_request_ttft_seconds_count") == ttft_n + 1
    assert sample("inference_objective_request_tpot_seconds_count") == tpot_n + 1
    assert sample("inference_objective_request_ttft_seconds_sum") == pytest.approx(
        ttft_sum + (r.ttft or 0))
    assert sample("inference_objective_inference_request_metric", type="tpot") == r.tpot
    assert sample("inference_objective_inference_request_metric", type="ttft") == r.ttft


def test_a_failed_response_records_no_ttft() -> None:
    d = director()
    before = sample("inference_objective_request_ttft_seconds_count")
    _, routed = d.route(HEADERS, body(), {})
    d.response_received(routed, 500, {"content-type": "application/json"})
    d.finish(routed, completed=True, status=500, response_size=5, prompt_tokens=0,
             completion_tokens=0)
    assert sample("inference_objective_request_ttft_seconds_count") == before
