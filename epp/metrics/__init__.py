"""Model-server metrics: a fast Prometheus text reader, engine dialects, and the scraper
that keeps every endpoint's :class:`epp.datastore.EndpointMetrics` fresh."""

from epp.metrics.dialects import (
    DIALECTS,
    Anomaly,
    Dialect,
    MetricsError,
    ParsedMetrics,
    parse_metrics,
)
from epp.metrics.parser import Sample, ScanResult, scan
from epp.metrics.scraper import Scraper, ScraperConfig

__all__ = [
    "DIALECTS",
    "Anomaly",
    "Dialect",
    "MetricsError",
    "ParsedMetrics",
    "Sample",
    "ScanResult",
    "Scraper",
    "ScraperConfig",
    "parse_metrics",
    "scan",
]
