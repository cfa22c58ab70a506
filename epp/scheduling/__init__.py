"""The scheduler: a pure function of (request, endpoint snapshot) → picked endpoints.

Per profile: filters → weighted scorers (total = sum clamp(score, 0, 1) * weight) → picker.
Configured from an ``EndpointPickerConfig`` (:func:`parse_config`, :func:`build_scheduler`).
Never does I/O; reads :class:`epp.datastore.EndpointView` objects and nothing else.
"""

from epp.scheduling.config import (
    ConfigError,
    EndpointPickerConfig,
    build_saturation_detector,
    build_scheduler,
    load_config_file,
    parse_config,
    parse_duration,
)
from epp.scheduling.plugin import (
    EndpointsRemoved,
    Filter,
    Picker,
    Plugin,
    PostPick,
    ProfileHandler,
    SchedulerHooks,
    Scorer,
)
from epp.scheduling.profile import SchedulingProfile, WeightedScorer
from epp.scheduling.registry import ENTRY_POINT_GROUP, PluginError, PluginRegistry
from epp.scheduling.request import LLMRequest, estimate_tokens, prefix_input
from epp.scheduling.result import ProfileResult, SchedulingResult
from epp.scheduling.saturation import SaturationDetectorConfig, UtilizationDetector
from epp.scheduling.scheduler import NoCandidates, NoEndpointPicked, Scheduler

__all__ = [
    "ENTRY_POINT_GROUP",
    "ConfigError",
    "EndpointPickerConfig",
    "EndpointsRemoved",
    "Filter",
    "LLMRequest",
    "NoCandidates",
    "NoEndpointPicked",
    "Picker",
    "Plugin",
    "PluginError",
    "PluginRegistry",
    "PostPick",
    "ProfileHandler",
    "ProfileResult",
    "SaturationDetectorConfig",
    "Scheduler",
    "SchedulerHooks",
    "SchedulingProfile",
    "SchedulingResult",
    "Scorer",
    "UtilizationDetector",
    "WeightedScorer",
    "build_saturation_detector",
    "build_scheduler",
    "estimate_tokens",
    "load_config_file",
    "parse_config",
    "parse_duration",
    "prefix_input",
]
