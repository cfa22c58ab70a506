"""What the scheduler answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from epp.datastore import EndpointView


@dataclass(slots=True)
class ProfileResult:
    """One profile's outcome: picked endpoints (best first) and, for debugging, the scores."""

    profile: str
    picked: list[EndpointView]
    #: Candidates that reached the scorers and their weighted totals (parallel sequences).
    candidates: Sequence[EndpointView] = ()
    totals: Sequence[float] = ()
    #: Name of the filter that emptied the candidate set, when one did.
    rejected_by: str | None = None

    def scores(self) -> dict[str, float]:
        """``{ip:port: total score}`` over the scored candidates (built on demand)."""
        return {v.key: t for v, t in zip(self.candidates, self.totals, strict=False)}


@dataclass(slots=True)
class SchedulingResult:
    """Every profile's result and which one the request goes to."""

    results: Mapping[str, ProfileResult]
    primary_profile: str
    #: Anything profile handlers want to hand on (e.g. a prefill endpoint header).
    extra_headers: dict[str, str] = field(default_factory=dict)
    #: Set by a pre-request plugin that sends the request elsewhere than the picks' own
    #: addresses (``data-parallel-profile-handler``: the pod's primary port).
    destination_override: str | None = None

    @property
    def primary(self) -> ProfileResult:
        """The primary profile's result."""
        return self.results[self.primary_profile]

    @property
    def endpoints(self) -> list[EndpointView]:
        """The primary picks, best first."""
        return self.primary.picked

    @property
    def destination(self) -> str:
        """The ``x-gateway-destination-endpoint`` value: ``ip:port[,ip:port...]``."""
        if self.destination_override is not None:
            return self.destination_override
        return ",".join(v.key for v in self.primary.picked)
