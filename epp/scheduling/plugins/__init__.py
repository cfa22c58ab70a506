"""Built-in scheduling plugins, one per file. Register a new one in :data:`BUILTIN_PLUGINS`."""

from __future__ import annotations

from epp.scheduling.plugin import Plugin
from epp.scheduling.plugins.kv_cache_scorer import KVCacheUtilizationScorer
from epp.scheduling.plugins.label_selector_filter import LabelSelectorFilter
from epp.scheduling.plugins.least_kv_cache_filter import LeastKVCacheFilter
from epp.scheduling.plugins.least_queue_filter import LeastQueueFilter
from epp.scheduling.plugins.legacy_decision_tree_filter import LegacyDecisionTreeFilter
from epp.scheduling.plugins.load_aware_scorer import LoadAwareScorer
from epp.scheduling.plugins.lora_affinity_filter import LoraAffinityFilter
from epp.scheduling.plugins.lora_affinity_scorer import LoraAffinityScorer
from epp.scheduling.plugins.low_queue_filter import LowQueueFilter
from epp.scheduling.plugins.max_score_picker import MaxScorePicker
from epp.scheduling.plugins.prefix_cache_scorer import PrefixCacheScorer
from epp.scheduling.plugins.queue_scorer import QueueScorer
from epp.scheduling.plugins.random_picker import RandomPicker
from epp.scheduling.plugins.running_requests_scorer import RunningRequestsSizeScorer
from epp.scheduling.plugins.single_profile_handler import SingleProfileHandler
from epp.scheduling.plugins.token_load_scorer import TokenLoadScorer
from epp.scheduling.plugins.weighted_random_picker import WeightedRandomPicker

BUILTIN_PLUGINS: tuple[type[Plugin], ...] = (
    QueueScorer,
    RunningRequestsSizeScorer,
    KVCacheUtilizationScorer,
    TokenLoadScorer,
    LoraAffinityScorer,
    LoadAwareScorer,
    PrefixCacheScorer,
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
)

__all__ = [
    "BUILTIN_PLUGINS",
    "KVCacheUtilizationScorer",
    "LabelSelectorFilter",
    "LeastKVCacheFilter",
    "LeastQueueFilter",
    "LegacyDecisionTreeFilter",
    "LoadAwareScorer",
    "LoraAffinityFilter",
    "LoraAffinityScorer",
    "LowQueueFilter",
    "MaxScorePicker",
    "PrefixCacheScorer",
    "QueueScorer",
    "RandomPicker",
    "RunningRequestsSizeScorer",
    "SingleProfileHandler",
    "TokenLoadScorer",
    "WeightedRandomPicker",
]
