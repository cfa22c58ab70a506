"""The data layer: data sources collect what is known about endpoints, extractors turn it
into typed attributes in the datastore. Built in: ``metrics-data-source`` (HTTP(S) polling
of ``/metrics``) with ``core-metrics-extractor`` (engine dialects)."""

from epp.datalayer.core_metrics import CoreMetricsExtractor, CoreMetricsParameters
from epp.datalayer.dcgm import DcgmDataSource, DcgmExtractor
from epp.datalayer.endpoint_events import (
    EndpointEvent,
    EndpointExtractor,
    EndpointNotificationSource,
    EventKind,
)
from epp.datalayer.k8s_events import (
    K8sNotificationSource,
    NotificationEvent,
    NotificationExtractor,
)
from epp.datalayer.metrics_source import MetricsDataSource, MetricsSourceParameters
from epp.datalayer.models_source import ModelsDataExtractor, ModelsDataSource, ServedModels
from epp.datalayer.plugin import DataSource, Extractor
from epp.datalayer.topology import Topology, TopologyExtractor

BUILTIN_PLUGINS = (MetricsDataSource, CoreMetricsExtractor, ModelsDataSource,
                   ModelsDataExtractor, EndpointNotificationSource, K8sNotificationSource,
                   TopologyExtractor, DcgmDataSource, DcgmExtractor)

__all__ = [
    "BUILTIN_PLUGINS",
    "CoreMetricsExtractor",
    "CoreMetricsParameters",
    "DataSource",
    "DcgmDataSource",
    "DcgmExtractor",
    "EndpointEvent",
    "EndpointExtractor",
    "EndpointNotificationSource",
    "EventKind",
    "Extractor",
    "K8sNotificationSource",
    "MetricsDataSource",
    "MetricsSourceParameters",
    "ModelsDataExtractor",
    "ModelsDataSource",
    "NotificationEvent",
    "NotificationExtractor",
    "ServedModels",
    "Topology",
    "TopologyExtractor",
]
