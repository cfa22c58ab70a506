"""The scheduler: a pure function of (request, endpoint snapshot) → picked endpoints.

Per profile: filters → weighted scorers (total = sum clamp(score, 0, 1) * weight) → picker.
Configured from an ``EndpointPickerConfig`` (:mod:`epp.config`).
Never does I/O; reads :class:`epp.datastore.EndpointView` objects and nothing else.
"""

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
from epp.scheduling.request import LLMRequest, estimate_tokens, prefix_input
from epp.scheduling.result import ProfileResult, SchedulingResult
from epp.scheduling.scheduler import NoCandidates, NoEndpointPicked, Scheduler
from shared.plugins import ENTRY_POINT_GROUP, PluginError, PluginRegistry

__all__ = [
    "ENTRY_POINT_GROUP",
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
    "Scheduler",
    "SchedulerHooks",
    "SchedulingProfile",
    "SchedulingResult",
    "Scorer",
    "WeightedScorer",
    "estimate_tokens",
    "prefix_input",
]
