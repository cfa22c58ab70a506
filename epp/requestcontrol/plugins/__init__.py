"""Built-in request-control plugins, one per file. Register a new one in
:data:`BUILTIN_PLUGINS`."""

from epp.requestcontrol.plugins.agent_identity import AgentIdentity
from epp.requestcontrol.plugins.anthropic_parser import AnthropicParser
from epp.requestcontrol.plugins.attribute_reporter import RequestAttributeReporter
from epp.requestcontrol.plugins.burst_prefix_cache_producer import BurstPrefixCacheProducer
from epp.requestcontrol.plugins.concurrency_detector import (
    ConcurrencyDetector,
    ConcurrencyParameters,
)
from epp.requestcontrol.plugins.disaggregatedset_rollout_screener import (
    DisaggregatedSetRolloutScreener,
)
from epp.requestcontrol.plugins.inflight_load import InflightLoadProducer
from epp.requestcontrol.plugins.latency_slo_admitter import LatencySloAdmitter
from epp.requestcontrol.plugins.metrics_recorder import RequestMetricsRecorder
from epp.requestcontrol.plugins.openai_parser import OpenAIParser
from epp.requestcontrol.plugins.p2p_source_producer import P2PSourceProducer
from epp.requestcontrol.plugins.passthrough_parser import PassthroughParser
from epp.requestcontrol.plugins.predicted_latency_producer import PredictedLatencyProducer
from epp.requestcontrol.plugins.probabilistic_admitter import ProbabilisticAdmitter
from epp.requestcontrol.plugins.served_verifier import DestinationEndpointServedVerifier
from epp.requestcontrol.plugins.session_id_producer import SessionIdProducer
from epp.requestcontrol.plugins.sglanghttp_parser import SglangHttpParser
from epp.requestcontrol.plugins.utilization_detector import (
    SaturationDetectorConfig,
    UtilizationDetector,
)
from epp.requestcontrol.plugins.vertexai_parser import VertexAIParser
from epp.requestcontrol.plugins.vllmgrpc_parser import VllmGrpcParser
from epp.requestcontrol.plugins.vllmhttp_parser import VllmHttpParser

BUILTIN_PLUGINS = (OpenAIParser, InflightLoadProducer, RequestMetricsRecorder,
                   UtilizationDetector, ConcurrencyDetector, PredictedLatencyProducer,
                   LatencySloAdmitter, PassthroughParser, ProbabilisticAdmitter,
                   DestinationEndpointServedVerifier, RequestAttributeReporter,
                   VllmGrpcParser, VertexAIParser, AgentIdentity, SessionIdProducer,
                   P2PSourceProducer, DisaggregatedSetRolloutScreener,
                   BurstPrefixCacheProducer, AnthropicParser, VllmHttpParser,
                   SglangHttpParser)

__all__ = [
    "BUILTIN_PLUGINS",
    "AgentIdentity",
    "AnthropicParser",
    "ConcurrencyDetector",
    "ConcurrencyParameters",
    "DestinationEndpointServedVerifier",
    "InflightLoadProducer",
    "LatencySloAdmitter",
    "OpenAIParser",
    "PassthroughParser",
    "PredictedLatencyProducer",
    "ProbabilisticAdmitter",
    "RequestAttributeReporter",
    "RequestMetricsRecorder",
    "SaturationDetectorConfig",
    "SessionIdProducer",
    "SglangHttpParser",
    "UtilizationDetector",
    "VertexAIParser",
    "VllmGrpcParser",
    "VllmHttpParser",
]
