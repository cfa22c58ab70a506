"""P/D profile handlers (llm-d's ``disagg-profile-handler`` and its older name
``pd-profile-handler``) and ``prefill-header-handler``.

Per request (``stageOrder: decode-first``, the default): the decode profile runs first and its
pick is where the request goes (primary). Then the prefill decider looks at that decode
endpoint; when it says so, the prefill profile runs too. With ``stageOrder: prefill-first``
(llm-d-router v0.10, ``disagg-profile-handler`` only) the prefill profile, when configured,
always runs first and then decode. Before the second stage runs, the first stage's pick is
published as the request attribute ``peer-endpoint`` (topology affinity reads it).
With an encode decider (``deciders.encode``, E/PD and E/P/D, llm-d-router v0.10) the encode
profile runs between the two stages (decode, encode, prefill; or prefill, encode, decode)
when the decider approves the request (``always-disagg-multimodal-decider``: the request has
multimodal items).
As a pre-request step the handler names the prefill profile's pick in
``x-prefiller-host-port`` and the encode profile's picks in ``x-encoder-hosts-ports``, which
the decode pod's ``pd-sidecar`` reads (docs/pd.md, docs/multimodal.md). No header when the
decider said no or no endpoint was found: the decode pod computes the prompt (or encodes the
items) itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from epp import telemetry as m
from epp.datalayer.topology import PEER_ENDPOINT
from epp.datastore import EndpointView
from epp.requestcontrol.plugin import PreRequest
from epp.scheduling.plugin import Plugin, ProfileHandler
from epp.scheduling.plugins.profile.pd_deciders import PDDecider
from epp.scheduling.profile import SchedulingProfile
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import ProfileResult, SchedulingResult
from modelserver.multimodal import ENCODER_HEADER
from modelserver.pd import PREFILLER_HEADER
from shared.plugins import Handle, PluginError

DECODE, PREFILL, ENCODE = "decode", "prefill", "encode"


def set_prefiller(result: SchedulingResult, prefill_profile: str) -> None:
    """Name the prefill profile's first pick in ``x-prefiller-host-port`` (if it picked)."""
    prefill = result.results.get(prefill_profile)
    if prefill is not None and prefill.picked:
        result.extra_headers[PREFILLER_HEADER] = prefill.picked[0].key
    else:
        result.extra_headers.pop(PREFILLER_HEADER, None)


def set_encoders(result: SchedulingResult, encode_profile: str) -> None:
    """Name the encode profile's picks in ``x-encoder-hosts-ports`` (if it picked)."""
    encode = result.results.get(encode_profile)
    if encode is not None and encode.picked:
        result.extra_headers[ENCODER_HEADER] = ",".join(v.key for v in encode.picked)
    else:
        result.extra_headers.pop(ENCODER_HEADER, None)


class PDProfileHandlerBase(ProfileHandler, PreRequest):
    """decode first (primary); encode when the encode decider approves the request; prefill
    when the prefill decider approves the decode pick."""

    def __init__(self, name: str, params: Any, *, decode: str, prefill: str,
                 decider: str | None, handle: Handle | None,
                 prefill_first: bool = False, encode: str = ENCODE,
                 encode_decider: str | None = None) -> None:
        super().__init__(name, params)
        self.decode_profile, self.prefill_profile = decode, prefill
        self.encode_profile = encode
        self.prefill_first = prefill_first
        self.decider_name = decider
        self.decider: PDDecider | None = None
        self.encode_decider_name = encode_decider
        self.encode_decider: PDDecider | None = None
        self._handle = handle

    def _bind(self, where: str, name: str) -> PDDecider:
        decider: PDDecider | None = None
        if self._handle is not None:
            try:
                decider = self._handle.plugin(name, PDDecider)
            except PluginError as e:
                raise ValueError(f"{where}: decider: {e}") from None
        if decider is None:
            raise ValueError(f"{where}: decider {name!r} not found")
        decider.bind()
        return decider

    def validate(self, profiles: Sequence[str]) -> None:
        where = f"plugin {self.name!r} ({self.type_name})"
        if self.decode_profile not in profiles:
            raise ValueError(f"{where}: no scheduling profile named {self.decode_profile!r} "
                             f"(the decode profile)")
        if self.decider_name and not self.prefill_first:
            if self.prefill_profile not in profiles:
                raise ValueError(f"{where}: no scheduling profile named "
                                 f"{self.prefill_profile!r} (the prefill profile)")
            self.decider = self._bind(where, self.decider_name)
        runs = [self.decode_profile, self.prefill_profile]
        if self.encode_decider_name:
            if self.encode_profile not in profiles:
                raise ValueError(f"{where}: no scheduling profile named "
                                 f"{self.encode_profile!r} (the encode profile)")
            self.encode_decider = self._bind(where, self.encode_decider_name)
            runs.append(self.encode_profile)
        unused = [p for p in profiles if p not in runs]
        if unused:
            raise ValueError(f"{where}: runs only the {', '.join(map(repr, runs))} profiles; "
                             f"{', '.join(unused)} would never run")

    def _encode_next(self, request: LLMRequest, profiles: Mapping[str, SchedulingProfile],
                     results: Mapping[str, ProfileResult],
                     decode: EndpointView | None) -> list[SchedulingProfile]:
        """The encode profile when it has not run and its decider approves (asked once:
        a refusal is remembered in ``request.plugin_state``)."""
        if (self.encode_decider is None or self.encode_profile in results
                or request.plugin_state.get(self._skip_key)):
            return []
        if self.encode_decider.disaggregate(request, decode):  # type: ignore[arg-type]
            return [profiles[self.encode_profile]]
        request.plugin_state[self._skip_key] = True
        return []

    @property
    def _skip_key(self) -> str:
        return f"{self.name}/encode-skipped"

    def pick_profiles(
        self,
        request: LLMRequest,
        profiles: Mapping[str, SchedulingProfile],
        results: Mapping[str, ProfileResult],
    ) -> list[SchedulingProfile]:
        if self.prefill_first:
            return self._prefill_first(request, profiles, results)
        decode = results.get(self.decode_profile)
        if decode is None:
            return [profiles[self.decode_profile]]
        if not decode.picked:
            return []
        encode = self._encode_next(request, profiles, results, decode.picked[0])
        if encode:
            return encode
        prefill = results.get(self.prefill_profile)
        if prefill is None and self.decider is not None and self.decider.disaggregate(
                request, decode.picked[0]):
            request.plugin_state[PEER_ENDPOINT] = decode.picked[0]
            return [profiles[self.prefill_profile]]
        self._count(request, results)
        return []

    def _prefill_first(self, request: LLMRequest, profiles: Mapping[str, SchedulingProfile],
                       results: Mapping[str, ProfileResult]) -> list[SchedulingProfile]:
        """prefill (when configured) always, then decode with the prefill pick as peer."""
        if self.decode_profile in results:
            if results[self.decode_profile].picked:
                self._count(request, results)
            return []
        if self.prefill_profile in profiles and self.prefill_profile not in results:
            return [profiles[self.prefill_profile]]
        encode = self._encode_next(request, profiles, results, None)
        if encode:
            return encode
        prefill = results.get(self.prefill_profile)
        if prefill is not None and prefill.picked:
            request.plugin_state[PEER_ENDPOINT] = prefill.picked[0]
        return [profiles[self.decode_profile]]

    def _count(self, request: LLMRequest, results: Mapping[str, ProfileResult]) -> None:
        prefill = results.get(self.prefill_profile)
        encode = results.get(self.encode_profile) if self.encode_decider else None
        # Counted as it turned out: a stage that found no endpoint did not run.
        prefilled = prefill is not None and bool(prefill.picked)
        encoded = encode is not None and bool(encode.picked)
        decision = ("encode-prefill-decode" if encoded and prefilled else
                    "encode-decode" if encoded else
                    "prefill-decode" if prefilled else "decode-only")
        m.disagg_decision(self.type_name, self.name, request.target_model, decision)

    def primary_profile(self, request: LLMRequest, results: Mapping[str, ProfileResult]) -> str:
        return self.decode_profile

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        set_prefiller(result, self.prefill_profile)
        if self.encode_decider_name:
            set_encoders(result, self.encode_profile)


@dataclass(frozen=True, slots=True)
class DisaggProfiles:
    """``profiles``: names of the decode, prefill and encode scheduling profiles."""

    decode: str = DECODE
    prefill: str = PREFILL
    encode: str = ENCODE


@dataclass(frozen=True, slots=True)
class DisaggDeciders:
    """``deciders``: ``prefill`` and ``encode`` name the decider plugins; a stage without
    one never runs (as llm-d)."""

    prefill: str = ""
    encode: str = ""


@dataclass(frozen=True, slots=True)
class DisaggProfileHandlerParameters:
    """llm-d's nested form (``profiles``, ``deciders``) or its older flat form
    (``decodeProfile``, ``prefillProfile``, ``deciderPluginName`` /
    ``prefillDeciderPluginName``, ``encodeProfile``, ``encodeDeciderPluginName``); mixing
    the two is an error, as in llm-d."""

    profiles: DisaggProfiles | None = None
    deciders: DisaggDeciders | None = None
    #: llm-d-router v0.10: ``decode-first`` (default) or ``prefill-first``.
    stage_order: Literal["decode-first", "prefill-first"] = "decode-first"
    decode_profile: str = ""
    prefill_profile: str = ""
    decider_plugin_name: str = ""
    prefill_decider_plugin_name: str = ""
    encode_profile: str = ""
    encode_decider_plugin_name: str = ""

    def __post_init__(self) -> None:
        flat = (self.decode_profile, self.prefill_profile, self.decider_plugin_name,
                self.prefill_decider_plugin_name, self.encode_profile,
                self.encode_decider_plugin_name)
        if any(flat) and (self.profiles is not None or self.deciders is not None):
            raise ValueError("cannot mix the flat parameters (decodeProfile, prefillProfile, "
                             "encodeProfile, deciderPluginName, prefillDeciderPluginName, "
                             "encodeDeciderPluginName) with the nested ones (profiles, "
                             "deciders): use one form")


class DisaggProfileHandler(PDProfileHandlerBase):
    """llm-d's ``disagg-profile-handler``: decode, then encode when ``deciders.encode``
    approves the request, then prefill when ``deciders.prefill`` approves the decode pick
    (P/D, E/PD, E/P/D); also the pre-request step that sets ``x-prefiller-host-port`` and
    ``x-encoder-hosts-ports``."""

    type_name = "disagg-profile-handler"
    parameters_type = DisaggProfileHandlerParameters
    params: DisaggProfileHandlerParameters

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> DisaggProfileHandler:
        p: DisaggProfileHandlerParameters = params
        profiles = p.profiles or DisaggProfiles()
        decider = (p.deciders.prefill if p.deciders else "") or \
            p.prefill_decider_plugin_name or p.decider_plugin_name
        encode_decider = (p.deciders.encode if p.deciders else "") or \
            p.encode_decider_plugin_name
        return cls(name, params, decode=p.decode_profile or profiles.decode,
                   prefill=p.prefill_profile or profiles.prefill, decider=decider or None,
                   handle=handle, prefill_first=p.stage_order == "prefill-first",
                   encode=p.encode_profile or profiles.encode,
                   encode_decider=encode_decider or None)


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
