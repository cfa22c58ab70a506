"""P/D profile handlers (llm-d's ``disagg-profile-handler`` and its older name
``pd-profile-handler``) and ``prefill-header-handler``.

Per request: the decode profile runs first and its pick is where the request goes (primary).
Then the prefill decider looks at that decode endpoint; when it says so, the prefill profile
runs too. As a pre-request step the handler names the prefill profile's pick in
``x-prefiller-host-port``, which the decode pod's ``pd-sidecar`` reads (docs/pd.md). No
header when the decider said no or no prefill endpoint was found: the decode pod computes
the prompt itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from epp import telemetry as m
from epp.requestcontrol.plugin import PreRequest
from epp.scheduling.plugin import Plugin, ProfileHandler
from epp.scheduling.plugins.profile.pd_deciders import PDDecider
from epp.scheduling.profile import SchedulingProfile
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import ProfileResult, SchedulingResult
from shared.pd import PREFILLER_HEADER
from shared.plugins import Handle, PluginError

DECODE, PREFILL = "decode", "prefill"


def set_prefiller(result: SchedulingResult, prefill_profile: str) -> None:
    """Name the prefill profile's first pick in ``x-prefiller-host-port`` (if it picked)."""
    prefill = result.results.get(prefill_profile)
    if prefill is not None and prefill.picked:
        result.extra_headers[PREFILLER_HEADER] = prefill.picked[0].key
    else:
        result.extra_headers.pop(PREFILLER_HEADER, None)


class PDProfileHandlerBase(ProfileHandler, PreRequest):
    """decode first (primary); prefill when the decider approves the decode pick."""

    def __init__(self, name: str, params: Any, *, decode: str, prefill: str,
                 decider: str | None, handle: Handle | None) -> None:
        super().__init__(name, params)
        self.decode_profile, self.prefill_profile = decode, prefill
        self.decider_name = decider
        self.decider: PDDecider | None = None
        self._handle = handle

    def validate(self, profiles: Sequence[str]) -> None:
        where = f"plugin {self.name!r} ({self.type_name})"
        if self.decode_profile not in profiles:
            raise ValueError(f"{where}: no scheduling profile named {self.decode_profile!r} "
                             f"(the decode profile)")
        if self.decider_name:
            if self.prefill_profile not in profiles:
                raise ValueError(f"{where}: no scheduling profile named "
                                 f"{self.prefill_profile!r} (the prefill profile)")
            if self._handle is not None:
                try:
                    self.decider = self._handle.plugin(self.decider_name, PDDecider)
                except PluginError as e:
                    raise ValueError(f"{where}: decider: {e}") from None
            if self.decider is None:
                raise ValueError(f"{where}: decider {self.decider_name!r} not found")
            self.decider.bind()
        unused = [p for p in profiles if p not in (self.decode_profile, self.prefill_profile)]
        if unused:
            raise ValueError(f"{where}: runs only the {self.decode_profile!r} and "
                             f"{self.prefill_profile!r} profiles; {', '.join(unused)} would "
                             f"never run")

    def pick_profiles(
        self,
        request: LLMRequest,
        profiles: Mapping[str, SchedulingProfile],
        results: Mapping[str, ProfileResult],
    ) -> list[SchedulingProfile]:
        decode = results.get(self.decode_profile)
        if decode is None:
            return [profiles[self.decode_profile]]
        if not decode.picked:
            return []
        prefill = results.get(self.prefill_profile)
        if prefill is None and self.decider is not None and self.decider.disaggregate(
                request, decode.picked[0]):
            return [profiles[self.prefill_profile]]
        # Counted as it turned out: a prefill profile that found no endpoint is decode-only.
        decision = "prefill-decode" if prefill is not None and prefill.picked else "decode-only"
        m.disagg_decision(self.type_name, self.name, request.target_model, decision)
        return []

    def primary_profile(self, request: LLMRequest, results: Mapping[str, ProfileResult]) -> str:
        return self.decode_profile

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        set_prefiller(result, self.prefill_profile)


@dataclass(frozen=True, slots=True)
class DisaggProfiles:
    """``profiles``: names of the decode and prefill scheduling profiles."""

    decode: str = DECODE
    prefill: str = PREFILL


@dataclass(frozen=True, slots=True)
class DisaggDeciders:
    """``deciders``: ``prefill`` names the decider plugin; without one nothing is
    disaggregated (as llm-d)."""

    prefill: str = ""


@dataclass(frozen=True, slots=True)
class DisaggProfileHandlerParameters:
    """llm-d's nested form (``profiles``, ``deciders``) or its older flat form
    (``decodeProfile``, ``prefillProfile``, ``deciderPluginName`` /
    ``prefillDeciderPluginName``); mixing the two is an error, as in llm-d. The encode stage
    (``profiles.encode``, ``deciders.encode``) is not implemented: its keys are refused."""

    profiles: DisaggProfiles | None = None
    deciders: DisaggDeciders | None = None
    decode_profile: str = ""
    prefill_profile: str = ""
    decider_plugin_name: str = ""
    prefill_decider_plugin_name: str = ""

    def __post_init__(self) -> None:
        flat = (self.decode_profile, self.prefill_profile, self.decider_plugin_name,
                self.prefill_decider_plugin_name)
        if any(flat) and (self.profiles is not None or self.deciders is not None):
            raise ValueError("cannot mix the flat parameters (decodeProfile, prefillProfile, "
                             "deciderPluginName, prefillDeciderPluginName) with the nested "
                             "ones (profiles, deciders): use one form")


class DisaggProfileHandler(PDProfileHandlerBase):
    """llm-d's ``disagg-profile-handler`` for P/D (decode, then prefill when
    ``deciders.prefill`` approves); also the pre-request step that sets
    ``x-prefiller-host-port``."""

    type_name = "disagg-profile-handler"
    parameters_type = DisaggProfileHandlerParameters
    params: DisaggProfileHandlerParameters

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> DisaggProfileHandler:
        p: DisaggProfileHandlerParameters = params
        profiles = p.profiles or DisaggProfiles()
        decider = (p.deciders.prefill if p.deciders else "") or \
            p.prefill_decider_plugin_name or p.decider_plugin_name
        return cls(name, params, decode=p.decode_profile or profiles.decode,
                   prefill=p.prefill_profile or profiles.prefill, decider=decider or None,
                   handle=handle)


@dataclass(frozen=True, slots=True)
class PdProfileHandlerParameters:
    """llm-d's deprecated ``pd-profile-handler``: ``deciderPluginName`` (default
    ``prefix-based-pd-decider``), ``decodeProfile``, ``prefillProfile``. ``prefixPluginType``
    and ``prefixPluginName`` are checked to name a configured plugin when given (llm-d no
    longer reads them). ``primaryPort`` (data parallel) is not implemented: only 0."""

    decode_profile: str = DECODE
    prefill_profile: str = PREFILL
    decider_plugin_name: str = "prefix-based-pd-decider"
    prefix_plugin_type: str = ""
    prefix_plugin_name: str = ""
    primary_port: int = 0

    def __post_init__(self) -> None:
        if self.primary_port != 0:
            raise ValueError("primaryPort (data-parallel ranks) is not implemented; remove it")
        if not self.decider_plugin_name:
            raise ValueError("deciderPluginName must name a decider plugin")


class PdProfileHandler(PDProfileHandlerBase):
    """llm-d's older name for the P/D profile handler (same behaviour as
    ``disagg-profile-handler``, with its own parameters)."""

    type_name = "pd-profile-handler"
    parameters_type = PdProfileHandlerParameters
    params: PdProfileHandlerParameters

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> PdProfileHandler:
        p: PdProfileHandlerParameters = params
        return cls(name, params, decode=p.decode_profile, prefill=p.prefill_profile,
                   decider=p.decider_plugin_name, handle=handle)

    def validate(self, profiles: Sequence[str]) -> None:
        super().validate(profiles)
        named = self.params.prefix_plugin_name
        if named and self._handle is not None and named not in self._handle:
            raise ValueError(f"plugin {self.name!r} ({self.type_name}): prefixPluginName: "
                             f"no plugin named {named!r}")
        kind = self.params.prefix_plugin_type
        if kind and self._handle is not None and not any(
                p.type_name == kind for p in self._handle):
            raise ValueError(f"plugin {self.name!r} ({self.type_name}): prefixPluginType: "
                             f"no plugin of type {kind!r}")


@dataclass(frozen=True, slots=True)
class PrefillHeaderHandlerParameters:
    """``prefillProfile``: the profile whose pick is named in the header."""

    prefill_profile: str = PREFILL


class PrefillHeaderHandler(Plugin, PreRequest):
    """llm-d's deprecated ``prefill-header-handler``: sets ``x-prefiller-host-port`` from the
    prefill profile's pick. The P/D profile handlers above already do this; it is kept so that
    older llm-d configs listing it load unchanged."""

    type_name = "prefill-header-handler"
    parameters_type = PrefillHeaderHandlerParameters
    params: PrefillHeaderHandlerParameters

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        set_prefiller(result, self.params.prefill_profile)
