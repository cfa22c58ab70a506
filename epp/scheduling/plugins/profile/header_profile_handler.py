"""``header-profile-handler`` (llm-d-router v0.10): run exactly the one profile a request
header names (a coordinator that drives each stage itself makes one call per stage)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from epp.scheduling.plugin import ProfileHandler
from epp.scheduling.profile import SchedulingProfile
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import ProfileResult

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class HeaderProfileParameters:
    """``headerName`` (default ``EPP-Profile``, matched case-insensitively);
    ``defaultProfile`` (default ``decode``): run when the header is missing or blank."""

    header_name: str = "EPP-Profile"
    default_profile: str = "decode"


class HeaderProfileHandler(ProfileHandler):
    """profile = the only one, when one is configured; else header(headerName) when it names
    a profile, ``defaultProfile`` when the header is missing or blank, and none (the request
    gets 429, as upstream) when it names a profile that is not configured. That profile is
    primary."""

    type_name = "header-profile-handler"
    parameters_type = HeaderProfileParameters
    params: HeaderProfileParameters

    def pick_profiles(
        self,
        request: LLMRequest,
        profiles: Mapping[str, SchedulingProfile],
        results: Mapping[str, ProfileResult],
    ) -> list[SchedulingProfile]:
        if results:
            return []
        name = self.chosen(request, profiles)
        found = profiles.get(name)
        if found is None:
            log.info("header-profile-handler: no such profile", request_id=request.request_id,
                     profile=name, header=self.params.header_name)
            return []
        return [found]

    def chosen(self, request: LLMRequest, profiles: Mapping[str, SchedulingProfile]) -> str:
        """The name of the profile ``request`` asks for."""
        if len(profiles) == 1:
            return next(iter(profiles))
        sent = request.headers.get(self.params.header_name.strip().lower(), "").strip()
        return sent or self.params.default_profile

    def primary_profile(self, request: LLMRequest, results: Mapping[str, ProfileResult]) -> str:
        return next(iter(results), "")
