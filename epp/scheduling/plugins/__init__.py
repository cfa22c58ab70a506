"""Built-in scheduling plugins, one per file. Register a new one in :data:`BUILTIN_PLUGINS`."""

from __future__ import annotations

from epp.scheduling.plugin import Plugin
from epp.scheduling.plugins.filter.by_label_filter import ByLabelFilter, ByLabelSelectorFilter
from epp.scheduling.plugins.filter.endpoint_attribute_filter import EndpointAttributeFilter
from epp.scheduling.plugins.filter.header_based_testing_filter import HeaderBasedTestingFilter
from epp.scheduling.plugins.filter.label_selector_filter import LabelSelectorFilter
from epp.scheduling.plugins.filter.least_kv_cache_filter import LeastKVCacheFilter
from epp.scheduling.plugins.filter.least_queue_filter import LeastQueueFilter
from epp.scheduling.plugins.filter.legacy_decision_tree_filter import LegacyDecisionTreeFilter
from epp.scheduling.plugins.filter.lora_affinity_filter import LoraAffinityFilter
from epp.scheduling.plugins.filter.low_queue_filter import LowQueueFilter
from epp.scheduling.plugins.filter.prefix_cache_affinity_filter import PrefixCacheAffinityFilter
from epp.scheduling.plugins.filter.role_filter import DecodeFilter, EncodeFilter, PrefillFilter
from epp.scheduling.plugins.filter.session_affinity_filter import SessionAffinityFilter
from epp.scheduling.plugins.filter.slo_headroom_tier_filter import SloHeadroomTierFilter
from epp.scheduling.plugins.filter.topology_affinity_filter import TopologyAffinityFilter
from epp.scheduling.plugins.filter.utilization_filter import UtilizationFilter
from epp.scheduling.plugins.multimodal.mm_embeddings_cache_producer import (
    MMEmbeddingsCacheProducer,
)
from epp.scheduling.plugins.multimodal.mm_embeddings_cache_scorer import MMEmbeddingsCacheScorer
from epp.scheduling.plugins.picker.max_score_picker import MaxScorePicker
from epp.scheduling.plugins.picker.random_picker import RandomPicker
from epp.scheduling.plugins.picker.weighted_random_picker import WeightedRandomPicker
from epp.scheduling.plugins.prefix.prefix_cache_scorer import PrefixCacheScorer
from epp.scheduling.plugins.profile.data_parallel_profile_handler import (
    DataParallelProfileHandler,
)
from epp.scheduling.plugins.profile.disagg_profile_handler import (
    DisaggProfileHandler,
    PdProfileHandler,
    PrefillHeaderHandler,
)
from epp.scheduling.plugins.profile.header_profile_handler import HeaderProfileHandler
from epp.scheduling.plugins.profile.multimodal_decider import AlwaysDisaggMultimodalDecider
from epp.scheduling.plugins.profile.pd_deciders import (
    AlwaysDisaggPDDecider,
    LoadAwarePDDecider,
    PDDecider,
    PrefixBasedPDDecider,
)
from epp.scheduling.plugins.profile.single_profile_handler import SingleProfileHandler
from epp.scheduling.plugins.scorer.active_request_scorer import ActiveRequestScorer
from epp.scheduling.plugins.scorer.context_length_aware import ContextLengthAware
from epp.scheduling.plugins.scorer.endpoint_attribute_scorer import EndpointAttributeScorer
from epp.scheduling.plugins.scorer.header_label_affinity_scorer import HeaderLabelAffinityScorer
from epp.scheduling.plugins.scorer.kv_cache_scorer import KVCacheUtilizationScorer
from epp.scheduling.plugins.scorer.latency_scorer import LatencyScorer
from epp.scheduling.plugins.scorer.load_aware_scorer import LoadAwareScorer
from epp.scheduling.plugins.scorer.lora_affinity_scorer import LoraAffinityScorer
from epp.scheduling.plugins.scorer.no_hit_lru_scorer import NoHitLRUScorer
from epp.scheduling.plugins.scorer.prefill_load_scorer import PrefillLoadScorer
from epp.scheduling.plugins.scorer.queue_scorer import QueueScorer
from epp.scheduling.plugins.scorer.running_requests_scorer import RunningRequestsSizeScorer
from epp.scheduling.plugins.scorer.session_affinity_scorer import SessionAffinityScorer
from epp.scheduling.plugins.scorer.token_load_scorer import TokenLoadScorer
from epp.scheduling.plugins.scorer.topology_affinity_scorer import TopologyAffinityScorer

BUILTIN_PLUGINS: tuple[type[Plugin], ...] = (
    QueueScorer,
    RunningRequestsSizeScorer,
    KVCacheUtilizationScorer,
    TokenLoadScorer,
    PrefillLoadScorer,
    LoraAffinityScorer,
    LoadAwareScorer,
    PrefixCacheScorer,
    SessionAffinityScorer,
    MaxScorePicker,
    RandomPicker,
    WeightedRandomPicker,
    SingleProfileHandler,
    LabelSelectorFilter,
    LowQueueFilter,
    LeastQueueFilter,
    LeastKVCacheFilter,
    LoraAffinityFilter,
    LegacyDecisionTreeFilter,
    LatencyScorer,
    SloHeadroomTierFilter,
    PrefixCacheAffinityFilter,
    HeaderBasedTestingFilter,
    ByLabelFilter,
    ByLabelSelectorFilter,
    ActiveRequestScorer,
    NoHitLRUScorer,
    ContextLengthAware,
    DataParallelProfileHandler,
    PrefillFilter,
    DecodeFilter,
    EncodeFilter,
    AlwaysDisaggMultimodalDecider,
    MMEmbeddingsCacheProducer,
    MMEmbeddingsCacheScorer,
    DisaggProfileHandler,
    PdProfileHandler,
    PrefillHeaderHandler,
    PrefixBasedPDDecider,
    LoadAwarePDDecider,
    AlwaysDisaggPDDecider,
    UtilizationFilter,
    SessionAffinityFilter,
    HeaderLabelAffinityScorer,
    HeaderProfileHandler,
    EndpointAttributeFilter,
    EndpointAttributeScorer,
    TopologyAffinityFilter,
    TopologyAffinityScorer,
)

__all__ = [
    "BUILTIN_PLUGINS",
    "ActiveRequestScorer",
    "AlwaysDisaggPDDecider",
    "ByLabelFilter",
    "ByLabelSelectorFilter",
    "ContextLengthAware",
    "DataParallelProfileHandler",
    "DecodeFilter",
    "DisaggProfileHandler",
    "EndpointAttributeFilter",
    "EndpointAttributeScorer",
    "HeaderBasedTestingFilter",
    "HeaderLabelAffinityScorer",
    "HeaderProfileHandler",
    "KVCacheUtilizationScorer",
    "LabelSelectorFilter",
    "LatencyScorer",
    "LeastKVCacheFilter",
    "LeastQueueFilter",
    "LegacyDecisionTreeFilter",
    "LoadAwarePDDecider",
    "LoadAwareScorer",
    "LoraAffinityFilter",
    "LoraAffinityScorer",
    "LowQueueFilter",
    "MaxScorePicker",
    "NoHitLRUScorer",
    "PDDecider",
    "PdProfileHandler",
    "PrefillFilter",
    "PrefillHeaderHandler",
    "PrefillLoadScorer",
    "PrefixBasedPDDecider",
    "PrefixCacheAffinityFilter",
    "PrefixCacheScorer",
    "QueueScorer",
    "RandomPicker",
    "RunningRequestsSizeScorer",
    "SessionAffinityFilter",
    "SessionAffinityScorer",
    "SingleProfileHandler",
    "SloHeadroomTierFilter",
    "TokenLoadScorer",
    "TopologyAffinityFilter",
    "TopologyAffinityScorer",
    "UtilizationFilter",
    "WeightedRandomPicker",
]
