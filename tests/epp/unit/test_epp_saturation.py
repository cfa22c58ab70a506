"""The utilization saturation detector."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from epp.requestcontrol.plugins import SaturationDetectorConfig, UtilizationDetector


def test_idle_fresh_pool_is_not_saturated(make_view) -> None:
    views = [make_view(1), make_view(2)]
    assert not UtilizationDetector().is_saturated(views, time.monotonic())


def test_endpoint_uses_the_larger_of_queue_and_kv_ratio(make_view) -> None:
    v = make_view(1, waiting=1, kv=0.6)  # max(1/5, 0.6/0.8)
    assert UtilizationDetector().endpoint_saturation(v, time.monotonic()) == pytest.approx(0.75)


def test_stale_metrics_count_as_fully_saturated(make_view) -> None:
    v = make_view(1, updated_at=time.monotonic() - 1.0)
    assert UtilizationDetector().endpoint_saturation(v, time.monotonic()) == 1.0


def test_pool_saturation_is_the_mean(make_view) -> None:
    views = [make_view(1, waiting=10), make_view(2, waiting=0)]  # 2.0 and 0.0
    assert UtilizationDetector().is_saturated(views, time.monotonic())


def test_empty_pool_is_saturated() -> None:
    assert UtilizationDetector().is_saturated([])


def test_thresholds_are_configurable(make_view) -> None:
    det = UtilizationDetector(SaturationDetectorConfig(queue_depth_threshold=100))
    assert not det.is_saturated([make_view(1, waiting=10)], time.monotonic())


def stale_gauge(detector: str) -> float | None:
    return REGISTRY.get_sample_value("llm_d_epp_flow_control_stale_endpoints",
                                     {"detector": detector})


def test_each_reading_exports_how_many_endpoints_were_stale(make_view) -> None:
    """v0.10's ``llm_d_epp_flow_control_stale_endpoints{detector}``: the endpoints a reading
    counted as saturated for want of fresh metrics, so 1.0 from a broken scrape can be told
    from load; an empty pool reads 0."""
    det = UtilizationDetector("stale-probe", SaturationDetectorConfig())
    now = time.monotonic()
    views = [make_view(1, updated_at=now - 1.0), make_view(2, updated_at=now - 2.0),
             make_view(3, waiting=1)]
    assert det.saturation(views, now) == pytest.approx((1 + 1 + 0.2) / 3)
    assert stale_gauge("stale-probe") == 2
    det.saturation(views[2:], now)
    assert stale_gauge("stale-probe") == 0
    det.saturation(views[:1], now)
    assert stale_gauge("stale-probe") == 1
    det.saturation([], now)
    assert stale_gauge("stale-probe") == 0
