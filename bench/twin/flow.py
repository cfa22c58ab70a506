"""The twin of an EPP with flow control: the real EPP runtime and flow controller
(:class:`bench.slo_twin.Twin` on :mod:`bench.twin.vtime`'s clock) in front of simulated
engines, keeping each request's timeline. :func:`bench.runner` plays a contender whose
EndpointPickerConfig has the ``flowControl`` feature gate through it."""

from __future__ import annotations

from dataclasses import dataclass

from bench.slo_twin import Twin
from epp.requestcontrol import Routed
from sim.engine import SimRequest


@dataclass(frozen=True, slots=True)
class Served:
    """One completed request's timeline (model seconds)."""

    tag: str
    arrival: float
    dispatched: float
    scheduled: float
    first_token: float
    finish: float
    tokens: int


class TimedTwin(Twin):
    """A :class:`Twin` that keeps each request's dispatch and engine times."""

    def __init__(self, config: str | None, seed: int, fleet: int) -> None:
        super().__init__(config, seed, fleet)
        self.served: list[Served] = []

    def _finish(self, routed: Routed, arrival: object, req: SimRequest, t: float) -> None:
        super()._finish(routed, arrival, req, t)  # type: ignore[arg-type]
        at = arrival.at  # type: ignore[attr-defined]
        self.served.append(Served(
            arrival.tag, at, req.arrival,  # type: ignore[attr-defined]
            req.first_scheduled if req.first_scheduled is not None else req.arrival,
            req.first_token_time if req.first_token_time is not None else t, t,
            req.generated))
