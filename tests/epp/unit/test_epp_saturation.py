"""The utilization saturation detector."""

from __future__ import annotations

import time

import pytest

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
