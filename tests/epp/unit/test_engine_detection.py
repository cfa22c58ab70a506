"""Which dialect ``core-metrics-extractor`` reads a page in: the pod's engine label, else
``defaultEngine``, else (unlabelled pods only) the dialect found on the page."""

from __future__ import annotations

import time

import pytest

from epp.datalayer import CoreMetricsExtractor
from epp.datalayer.core_metrics import CoreMetricsParameters
from epp.datastore import EngineType
from epp.datastore.models import ENGINE_TYPE_LABEL
from epp.metrics import MetricsError
from epp.metrics.dialects import detect_engine
from epp.testing import PluginHarness, endpoint

PAGES = {
    EngineType.VLLM: "vllm:num_requests_waiting 3\nvllm:num_requests_running 1\n"
                     "vllm:kv_cache_usage_perc 0.5\n",
    EngineType.SGLANG: "sglang:num_queue_reqs 3\nsglang:num_running_reqs 1\n"
                       "sglang:token_usage 0.5\n",
    EngineType.TRTLLM_SERVE: "trtllm_num_requests_waiting 3\ntrtllm_num_requests_running 1\n"
                             "trtllm_kv_cache_utilization 0.5\n",
    EngineType.TRITON_TRTLLM: 'nv_trt_llm_request_metrics{request_type="waiting"} 3\n'
                              'nv_trt_llm_request_metrics{request_type="scheduled"} 1\n'
                              'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}'
                              ' 0.5\n',
}


def extractor(**params: object) -> CoreMetricsExtractor:
    plugin = PluginHarness.of("core-metrics-extractor", params or None).plugin
    assert isinstance(plugin, CoreMetricsExtractor)
    return plugin


@pytest.mark.parametrize("engine", list(PAGES))
def test_each_dialect_is_detected_from_its_page(engine: EngineType) -> None:
    assert detect_engine(PAGES[engine]) is engine


def test_page_of_no_known_engine_is_not_detected() -> None:
    assert detect_engine("process_cpu_seconds_total 12\n") is None


@pytest.mark.parametrize("engine", [e for e in PAGES if e is not EngineType.VLLM])
def test_unlabelled_pod_of_another_engine_is_read_in_its_dialect(engine: EngineType) -> None:
    ext = extractor()
    view = endpoint(1)
    parsed = ext.extract(PAGES[engine], view, time.monotonic())
    assert (parsed.metrics.waiting, parsed.metrics.running, parsed.metrics.kv_usage) == (
        3, 1, 0.5)
    assert ext.engine(view) is engine  # remembered for the next scrape


def test_unlabelled_vllm_pod_stays_vllm() -> None:
    ext = extractor()
    view = endpoint(1)
    assert ext.extract(PAGES[EngineType.VLLM], view, time.monotonic()).metrics.waiting == 3
    assert ext.engine(view) is EngineType.VLLM


def test_default_engine_is_used_for_unlabelled_pods_first() -> None:
    ext = extractor(defaultEngine="sglang")
    view = endpoint(1)
    assert ext.engine(view) is EngineType.SGLANG
    assert ext.extract(PAGES[EngineType.SGLANG], view, time.monotonic()).metrics.waiting == 3


def test_a_label_is_obeyed_even_when_the_page_disagrees() -> None:
    ext = extractor()
    view = endpoint(1, labels={ENGINE_TYPE_LABEL: "vllm"})
    with pytest.raises(MetricsError):
        ext.extract(PAGES[EngineType.SGLANG], view, time.monotonic())


def test_unlabelled_page_of_no_known_engine_is_still_an_error() -> None:
    with pytest.raises(MetricsError):
        extractor().extract("process_cpu_seconds_total 12\n", endpoint(1), time.monotonic())


def test_detected_engines_of_departed_endpoints_are_forgotten() -> None:
    ext = extractor()
    stays, leaves = endpoint(1), endpoint(2)
    for view in (stays, leaves):
        ext.extract(PAGES[EngineType.SGLANG], view, time.monotonic())
    ext.retain_endpoints(frozenset({stays.key}))
    assert set(ext.detected) == {stays.key}


def test_parameters_default_to_upstreams() -> None:
    assert CoreMetricsParameters().default_engine == "vllm"
    assert CoreMetricsParameters().engine_label_key == ENGINE_TYPE_LABEL
