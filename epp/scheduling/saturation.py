"""The ``utilization`` saturation detector: is the pool too busy for sheddable requests?"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore import EndpointView


@dataclass(frozen=True, slots=True)
class SaturationDetectorConfig:
    """``saturationDetector`` of the EndpointPickerConfig (upstream names and defaults)."""

    queue_depth_threshold: int = 5
    kv_cache_util_threshold: float = 0.8
    #: Seconds; metrics older than this make an endpoint count as fully saturated.
    metrics_staleness_threshold: float = 0.2


class UtilizationDetector:
    """Per endpoint: max(queue / queueDepthThreshold, kv / kvCacheUtilThreshold), or 1 when
    its metrics are stale; pool saturation = mean over endpoints (1 for an empty pool);
    saturated when >= 1.

    ``queue`` is :attr:`EndpointView.queue`, so requests routed since the last scrape count.
    """

    def __init__(self, config: SaturationDetectorConfig | None = None) -> None:
        self.config = config or SaturationDetectorConfig()

    def endpoint_saturation(self, view: EndpointView, now: float) -> float:
        """One endpoint's utilisation (1 = at the threshold)."""
        c = self.config
        if view.age(now) > c.metrics_staleness_threshold:
            return 1.0
        q = view.queue / c.queue_depth_threshold if c.queue_depth_threshold > 0 else 0.0
        kv = (
            view.metrics.kv_usage / c.kv_cache_util_threshold
            if c.kv_cache_util_threshold > 0
            else 0.0
        )
        return max(q, kv)

    def saturation(self, views: Sequence[EndpointView], now: float | None = None) -> float:
        """Mean utilisation of ``views`` (1.0 when there are none)."""
        if not views:
            return 1.0
        now = time.monotonic() if now is None else now
        return sum(self.endpoint_saturation(v, now) for v in views) / len(views)

    def is_saturated(self, views: Sequence[EndpointView], now: float | None = None) -> bool:
        """True when sheddable requests should be rejected (429)."""
        return self.saturation(views, now) >= 1.0
