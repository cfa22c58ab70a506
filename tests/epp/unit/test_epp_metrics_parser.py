"""Reading model-server metrics pages in each engine dialect."""

from __future__ import annotations

import pytest

from epp.datastore import EngineType
from epp.metrics import MetricsError, parse_metrics, scan

LORA = "vllm:lora_requests_info"
VLLM = """\
# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
vllm:num_requests_running{model_name="m"} 7.0
vllm:kv_cache_usage_perc{model_name="m"} 0.42
vllm:num_requests_waiting_by_priority{model_name="m"} 99.0
vllm:cache_config_info{block_size="16",num_gpu_blocks="2048",model_name="m"} 1.0
"""
VLLM += LORA + '{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 1700000002.0\n'
VLLM += LORA + '{max_lora="2",running_lora_adapters="old",waiting_lora_adapters="c"} 1700000001.0\n'


def test_vllm_load_metrics() -> None:
    m = parse_metrics(VLLM, EngineType.VLLM, 5.0).metrics
    assert (m.waiting, m.running, m.kv_usage, m.updated_at) == (3, 7, 0.42, 5.0)


def test_family_with_a_longer_name_is_not_confused() -> None:
    assert parse_metrics(VLLM, EngineType.VLLM, 0).metrics.waiting == 3


def test_vllm_cache_config() -> None:
    m = parse_metrics(VLLM, EngineType.VLLM, 0).metrics
    assert (m.block_size, m.num_gpu_blocks) == (16, 2048)


def test_newest_lora_info_wins() -> None:
    lora = parse_metrics(VLLM, EngineType.VLLM, 0).metrics.lora
    assert lora is not None
    assert (lora.max_lora, lora.running, lora.waiting) == (2, {"a", "b"}, frozenset())


def test_older_vllm_gpu_cache_usage_is_the_fallback() -> None:
    page = "vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.3\n"
    assert parse_metrics(page, EngineType.VLLM, 0).metrics.kv_usage == 0.3


def test_sglang_dialect() -> None:
    page = ("sglang:num_queue_reqs{name=\"m\"} 4\nsglang:num_running_reqs{name=\"m\"} 2\n"
            "sglang:token_usage{name=\"m\"} 0.5\n"
            "sglang:cache_config_info{page_size=\"1\",num_pages=\"9000\"} 1\n")
    m = parse_metrics(page, EngineType.SGLANG, 0).metrics
    assert (m.waiting, m.running, m.kv_usage, m.block_size, m.num_gpu_blocks) == (
        4, 2, 0.5, 1, 9000)


def test_trtllm_serve_dialect() -> None:
    page = ("trtllm_num_requests_waiting 2\ntrtllm_num_requests_running 3\n"
            "trtllm_kv_cache_utilization 0.25\n")
    m = parse_metrics(page, EngineType.TRTLLM_SERVE, 0).metrics
    assert (m.waiting, m.running, m.kv_usage) == (2, 3, 0.25)


def test_triton_dialect_selects_samples_by_label() -> None:
    page = (
        'nv_trt_llm_request_metrics{model="m",request_type="waiting"} 5\n'
        'nv_trt_llm_request_metrics{model="m",request_type="scheduled"} 8\n'
        'nv_trt_llm_request_metrics{model="m",request_type="max"} 512\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"} 0.6\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used"} 600\n'
    )
    m = parse_metrics(page, EngineType.TRITON_TRTLLM, 0).metrics
    assert (m.waiting, m.running, m.kv_usage) == (5, 8, 0.6)


def test_samples_of_several_engines_are_summed() -> None:
    page = ('vllm:num_requests_waiting{engine="0"} 2\nvllm:num_requests_waiting{engine="1"} 3\n'
            'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.4\n')
    m = parse_metrics(page, EngineType.VLLM, 0).metrics
    assert (m.waiting, m.kv_usage) == (5, pytest.approx(0.3))


def test_kv_usage_above_one_is_clamped_and_reported() -> None:
    parsed = parse_metrics("vllm:kv_cache_usage_perc 1.7\n", EngineType.VLLM, 0)
    assert parsed.metrics.kv_usage == 1.0
    assert [a.problem for a in parsed.anomalies] == ["value above 1 clamped to 1"]


def test_negative_queue_is_clamped_to_zero() -> None:
    parsed = parse_metrics("vllm:num_requests_waiting -4\n", EngineType.VLLM, 0)
    assert parsed.metrics.waiting == 0 and parsed.anomalies


def test_nan_and_inf_samples_are_dropped() -> None:
    page = "vllm:num_requests_waiting NaN\nvllm:num_requests_running +Inf\n" \
           "vllm:kv_cache_usage_perc 0.1\n"
    parsed = parse_metrics(page, EngineType.VLLM, 0)
    assert (parsed.metrics.waiting, parsed.metrics.running) == (0, 0)
    assert len(parsed.anomalies) == 2


def test_malformed_lines_are_skipped_and_counted() -> None:
    page = ('vllm:num_requests_waiting{model_name="m" 3\nvllm:num_requests_waiting 4\n'
            "vllm:num_requests_running seven\n")
    parsed = parse_metrics(page, EngineType.VLLM, 0)
    assert (parsed.metrics.waiting, parsed.malformed_lines) == (4, 2)


def test_label_values_may_hold_escapes_and_separators() -> None:
    page = 'x{a="q\\"uo,te}",b="back\\\\slash",c="new\\nline"} 1 1700000000000\n'
    (sample,) = scan(page, ["x"]).families["x"]
    assert sample.labels == {"a": 'q"uo,te}', "b": "back\\slash", "c": "new\nline"}


def test_page_without_any_load_metric_is_an_error() -> None:
    with pytest.raises(MetricsError, match="no vllm load metrics"):
        parse_metrics("go_goroutines 12\n", EngineType.VLLM, 0)


def test_missing_families_are_reported() -> None:
    parsed = parse_metrics("vllm:num_requests_waiting 1\n", EngineType.VLLM, 0)
    assert parsed.missing == ("running", "kv_usage")
