"""The data layer: data sources collect what is known about endpoints, extractors turn it
into typed attributes in the datastore. Built in: ``metrics-data-source`` (HTTP(S) polling
of ``/metrics``) with ``core-metrics-extractor`` (engine dialects)."""

from epp.datalayer.core_metrics import CoreMetricsExtractor, CoreMetricsParameters
from epp.datalayer.endpoint_notification import (
    EndpointExtractor,
    EndpointNotificationSource,
)
from epp.datalayer.metrics_source import MetricsDataSource, MetricsSourceParameters
from epp.datalayer.plugin import DataSource, Extractor

BUILTIN_PLUGINS = (MetricsDataSource, CoreMetricsExtractor, EndpointNotificationSource)

__all__ = ["BUILTIN_PLUGINS", "CoreMetricsExtractor", "CoreMetricsParameters", "DataSource",
           "EndpointExtractor", "EndpointNotificationSource", "Extractor", "MetricsDataSource",
           "MetricsSourceParameters"]
