"""``single-profile-handler``: run the one profile; its result is primary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from epp.scheduling.plugin import ProfileHandler
from epp.scheduling.profile import SchedulingProfile
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import ProfileResult


class SingleProfileHandler(ProfileHandler):
    """Runs every configured profile once (there must be exactly one) and makes it primary."""

    type_name = "single-profile-handler"

    def validate(self, profiles: Sequence[str]) -> None:
        if len(profiles) != 1:
            raise ValueError(
                f"single-profile-handler needs exactly one scheduling profile, got "
                f"{len(profiles)} ({', '.join(profiles) or 'none'})"
            )

    def pick_profiles(
        self,
        request: LLMRequest,
        profiles: Mapping[str, SchedulingProfile],
        results: Mapping[str, ProfileResult],
    ) -> list[SchedulingProfile]:
        return [] if results else list(profiles.values())

    def primary_profile(self, request: LLMRequest, results: Mapping[str, ProfileResult]) -> str:
        return next(iter(results))
