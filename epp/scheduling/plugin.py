"""Plugin kinds of the scheduling framework.

A plugin is a :class:`shared.plugins.Plugin` (a ``type_name`` configs call it by, a
``parameters_type`` dataclass for its YAML ``parameters``) with one or more of the extension
points below. Scores are parallel to the candidate sequence (``scores[i]`` belongs to
``endpoints[i]``), which keeps the hot path free of per-endpoint dicts.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, ClassVar

from epp.datastore import EndpointView
from epp.scheduling.request import LLMRequest
from shared.plugins import NoParameters
from shared.plugins import Plugin as BasePlugin

if TYPE_CHECKING:
    from epp.scheduling.profile import SchedulingProfile
    from epp.scheduling.result import ProfileResult, SchedulingResult


@dataclass(slots=True)
class SchedulerHooks:
    """Callables the scheduler reports timings and cache effectiveness to (all optional).

    The handler wires these to Prometheus: ``e2e_duration`` →
    ``inference_extension_scheduler_e2e_duration_seconds``; ``plugin_duration(extension point,
    plugin type, plugin name, seconds)`` → ``..._plugin_duration_seconds``;
    ``prefix_hit_ratio`` → ``..._prefix_indexer_hit_ratio``; ``prefix_hit_bytes`` (prompt
    bytes matched, blocks x block length) → ``..._prefix_indexer_hit_bytes``.
    """

    e2e_duration: Callable[[float], None] | None = None
    plugin_duration: Callable[[str, str, str, float], None] | None = None
    prefix_hit_ratio: Callable[[float], None] | None = None
    prefix_hit_bytes: Callable[[int], None] | None = None
    #: The same two, told which plugin (type, name) reports: :meth:`for_plugin` binds them
    #: into ``prefix_hit_ratio`` / ``prefix_hit_bytes`` (``llm_d_epp_prefix_indexer_*``
    #: carry the plugin's labels).
    plugin_prefix_hit_ratio: Callable[[str, str, float], None] | None = None
    plugin_prefix_hit_bytes: Callable[[str, str, int], None] | None = None

    def for_plugin(self, kind: str, name: str) -> SchedulerHooks:
        """These hooks as plugin ``kind``/``name`` reports through them."""
        if self.plugin_prefix_hit_ratio is None and self.plugin_prefix_hit_bytes is None:
            return self
        return replace(
            self,
            prefix_hit_ratio=(partial(self.plugin_prefix_hit_ratio, kind, name)
                              if self.plugin_prefix_hit_ratio else self.prefix_hit_ratio),
            prefix_hit_bytes=(partial(self.plugin_prefix_hit_bytes, kind, name)
                              if self.plugin_prefix_hit_bytes else self.prefix_hit_bytes))


class Plugin(BasePlugin):
    """Base of every EPP plugin (scheduling, request control, data layer)."""

    def attach(self, hooks: SchedulerHooks) -> None:
        """Receive the scheduler's hooks (override to report through them)."""


class Filter(Plugin, ABC):
    """Removes candidates that must not serve the request."""

    @abstractmethod
    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        """The subset of ``endpoints`` that may serve ``request`` (order kept)."""


class Scorer(Plugin, ABC):
    """Rates candidates in [0, 1]; the profile multiplies by the scorer's weight."""

    #: True when every score is already in [0, 1]: the framework then skips clamping.
    bounded: ClassVar[bool] = False

    @abstractmethod
    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        """One score per endpoint, parallel to ``endpoints``."""


class Picker(Plugin, ABC):
    """Chooses the endpoints to send to, best first, from the scored candidates."""

    @abstractmethod
    def pick(
        self,
        request: LLMRequest,
        endpoints: Sequence[EndpointView],
        scores: Sequence[float],
        rng: random.Random,
    ) -> list[EndpointView]:
        """The picked endpoints in preference order (empty when none)."""


class ProfileHandler(Plugin, ABC):
    """Decides which profiles run for a request and which result is primary."""

    @abstractmethod
    def pick_profiles(
        self,
        request: LLMRequest,
        profiles: Mapping[str, SchedulingProfile],
        results: Mapping[str, ProfileResult],
    ) -> list[SchedulingProfile]:
        """Profiles to run next given what already ran; empty ends the cycle."""

    @abstractmethod
    def primary_profile(self, request: LLMRequest, results: Mapping[str, ProfileResult]) -> str:
        """Name of the profile whose picks the request is sent to."""

    def validate(self, profiles: Sequence[str]) -> None:
        """Raise ValueError when this handler cannot work with these profiles."""


class PostPick(ABC):
    """Mixin: learns from the final decision when the scheduler is used on its own
    (:meth:`Scheduler.post_pick`); behind the director the same learning runs as a
    request-control ``PreRequest`` plugin."""

    @abstractmethod
    def post_pick(self, request: LLMRequest, result: SchedulingResult) -> None:
        """Called once the request is committed to ``result``'s primary endpoint."""


class EndpointsRemoved(ABC):
    """Mixin: drops per-endpoint state for endpoints that left the pool."""

    @abstractmethod
    def retain_endpoints(self, keys: frozenset[str]) -> None:
        """Forget everything about endpoints whose key is not in ``keys``."""


__all__ = ["EndpointsRemoved", "Filter", "NoParameters", "Picker", "Plugin", "PostPick",
           "ProfileHandler", "SchedulerHooks", "Scorer"]
