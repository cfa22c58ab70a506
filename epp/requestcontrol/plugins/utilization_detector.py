"""``utilization-detector``: is the pool too busy for sheddable requests? (upstream's default
saturation detector)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epp.datastore import EndpointView
from epp.flowcontrol.metrics import stale_endpoints_gauge
from epp.requestcontrol.plugin import SaturationDetector
from epp.scheduling.plugin import Plugin
from shared.plugins import Duration


@dataclass(frozen=True, slots=True)
class SaturationDetectorConfig:
    """Upstream names and defaults (also accepted as the legacy ``saturationDetector``
    section of the EndpointPickerConfig)."""

    queue_depth_threshold: int = 5
    kv_cache_util_threshold: float = 0.8
    #: Seconds; metrics older than this make an endpoint count as fully saturated.
    metrics_staleness_threshold: Duration = Duration(0.2)  # noqa: RUF009 (immutable)

    def __post_init__(self) -> None:
        if self.queue_depth_threshold <= 0:
            raise ValueError(f"queueDepthThreshold: must be an integer > 0, got "
                             f"{self.queue_depth_threshold!r}")
        if not 0 < self.kv_cache_util_threshold <= 1:
            raise ValueError(f"kvCacheUtilThreshold: must be in (0, 1], got "
                             f"{self.kv_cache_util_threshold!r}")


class UtilizationDetector(Plugin, SaturationDetector):
    """Per endpoint: max(queue / queueDepthThreshold, kv / kvCacheUtilThreshold), or 1 when
    its metrics are stale; pool saturation = mean over endpoints (1 for an empty pool);
    saturated when >= 1.

    ``queue`` is :attr:`EndpointView.queue`, so requests routed since the last scrape count.
    Each reading sets ``llm_d_epp_flow_control_stale_endpoints{detector=<name>}`` to the
    number of stale endpoints among ``views`` (0 for an empty pool).
    """

    type_name = "utilization-detector"
    parameters_type = SaturationDetectorConfig
    params: SaturationDetectorConfig

    def __init__(self, name: str = "", params: Any = None) -> None:
        if isinstance(name, SaturationDetectorConfig):  # UtilizationDetector(config)
            name, params = "", name
        super().__init__(name, params)
        self._stale = stale_endpoints_gauge().labels(self.name)

    @property
    def config(self) -> SaturationDetectorConfig:
        return self.params

    def endpoint_saturation(self, view: EndpointView, now: float) -> float:
        """One endpoint's utilisation (1 = at the threshold)."""
        c = self.params
        if view.age(now) > c.metrics_staleness_threshold:
            return 1.0
        q = view.queue / c.queue_depth_threshold
        kv = view.metrics.kv_usage / c.kv_cache_util_threshold
        return max(q, kv)

    def saturation(self, views: Sequence[EndpointView], now: float | None = None) -> float:
        """Mean utilisation of ``views`` (1.0 when there are none)."""
        if not views:
            self._stale.set(0)
            return 1.0
        now = time.monotonic() if now is None else now
        limit = self.params.metrics_staleness_threshold
        total, stale = 0.0, 0
        for v in views:
            if v.age(now) > limit:
                stale += 1
                total += 1.0
            else:
                total += self.endpoint_saturation(v, now)
        self._stale.set(stale)
        return total / len(views)

    def is_saturated(self, views: Sequence[EndpointView], now: float | None = None) -> bool:
        return self.saturation(views, now) >= 1.0
