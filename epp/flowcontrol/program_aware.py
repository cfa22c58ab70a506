"""``program-aware-fairness`` (llm-d-router v0.10): fairness between programs (agents,
workflows, tenants: the fairness id) by the service each has attained, in tokens.

Least attained service (``strategy: las``, upstream's only strategy). Each program's
attained service S grows at every completed response by ``prompt_tokens + 2 x
completion_tokens`` (the response's ``usage``; output weighs twice, as upstream). Among the
flows of a band with requests waiting, the one with the highest

    score = lasWeightService x (1 - norm(S)) + lasWeightHeadWait x norm(head wait)

goes next, where norm(x) = (x - min) / (max - min) over the waiting flows (0.5 when all are
equal); ties go to the smaller fairness id. A program with nothing waiting and nothing in
flight decays: S x 0.5^(t / lasHalfLifeSeconds) when a half-life is set, else S x
lasDecayFactor at every pick. A program with no completion for ``evictionTtlSeconds`` and
nothing in flight is forgotten (checked every ``evictionSweepSeconds``), so ids invented by
clients do not pile up.

Exported as upstream does: ``llm_d_epp_program_aware_attained_service_tokens{program_id}``
(S at each completion), ``llm_d_epp_program_aware_avg_wait_time_milliseconds{program_id}``
(the running mean of the queue wait, in whole milliseconds, of the program's requests this
policy released from the queue; a request that never queued adds nothing) and
``llm_d_epp_program_aware_jains_fairness_index`` = (sum w)^2 / (n x sum w^2) over the programs'
mean waits w (1 with fewer than two programs that have waited), recomputed at every pick. A
forgotten program's series go with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from prometheus_client import Gauge

from shared.plugins import Plugin

if TYPE_CHECKING:
    from epp.flowcontrol.queues import Band, FlowQueue

#: Upstream's weights of a token in attained service.
INPUT_TOKEN_WEIGHT, OUTPUT_TOKEN_WEIGHT = 1, 2

_attained: Gauge | None = None
_avg_wait: Gauge | None = None
_fairness: Gauge | None = None


def attained_service_gauge() -> Gauge:
    """``llm_d_epp_program_aware_attained_service_tokens{program_id}`` (upstream's name)."""
    global _attained
    if _attained is None:
        _attained = Gauge("llm_d_epp_program_aware_attained_service_tokens",
                          "Time-decayed attained service (weighted tokens) per program.",
                          ["program_id"])
    return _attained


def avg_wait_gauge() -> Gauge:
    """``llm_d_epp_program_aware_avg_wait_time_milliseconds{program_id}`` (upstream's name)."""
    global _avg_wait
    if _avg_wait is None:
        _avg_wait = Gauge("llm_d_epp_program_aware_avg_wait_time_milliseconds",
                          "Running mean of the flow-control queue wait per program, in "
                          "milliseconds.", ["program_id"])
    return _avg_wait


def fairness_index_gauge() -> Gauge:
    """``llm_d_epp_program_aware_jains_fairness_index`` (upstream's name)."""
    global _fairness
    if _fairness is None:
        _fairness = Gauge("llm_d_epp_program_aware_jains_fairness_index",
                          "Jain's fairness index over the programs' mean queue waits.")
    return _fairness


def jains_index(values: list[float]) -> float:
    """(sum x)^2 / (n x sum x^2); 1 (fair) for fewer than two values or all zero."""
    n = len(values)
    sq = sum(x * x for x in values)
    if n <= 1 or sq == 0:
        return 1.0
    return sum(values) ** 2 / (n * sq)


@dataclass(frozen=True, slots=True)
class ProgramAwareParameters:
    """Upstream's parameters and defaults."""

    strategy: Literal["las"] = "las"
    las_weight_service: float = 0.8
    las_weight_head_wait: float = 0.2
    las_decay_factor: float = 0.99997
    las_half_life_seconds: float = 0.0
    eviction_ttl_seconds: float = 3600.0
    eviction_sweep_seconds: float = 300.0

    def __post_init__(self) -> None:
        for name in ("las_weight_service", "las_weight_head_wait", "las_half_life_seconds",
                     "eviction_ttl_seconds"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
        if not 0 < self.las_decay_factor <= 1:
            raise ValueError(f"lasDecayFactor: must be in (0, 1], got {self.las_decay_factor!r}")
        if not (math.isfinite(self.eviction_sweep_seconds) and self.eviction_sweep_seconds > 0):
            raise ValueError("evictionSweepSeconds: must be > 0")


@dataclass(slots=True)
class _Program:
    service: float = 0.0
    #: Monotonic time the service last grew or decayed.
    anchor: float = 0.0
    last_completion: float = 0.0
    #: Requests released from the queue and their running mean wait (ms).
    waits: int = 0
    avg_wait_ms: float = 0.0


class ProgramAwareFairness(Plugin):
    """Least attained service between the programs of a band (see the module docstring)."""

    type_name: ClassVar[str] = "program-aware-fairness"
    parameters_type = ProgramAwareParameters
    params: ProgramAwareParameters

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)
        self.programs: dict[str, _Program] = {}
        self._next_sweep = 0.0
        self.clock = time.monotonic

    def new_state(self) -> None:
        return None

    def service(self, program_id: str) -> float:
        """The program's attained service now (0 for an unknown one)."""
        p = self.programs.get(program_id)
        return p.service if p is not None else 0.0

    def pick(self, band: Band) -> FlowQueue | None:
        now = self.clock()
        waiting = {fid: f for fid, f in band.flows.items() if f.length}
        self._decay_idle(band, waiting, now)
        if now >= self._next_sweep:
            self._sweep(band, now)
        if not waiting:
            return None
        loop_now = _loop_time()
        services = {fid: self.service(fid) for fid in waiting}
        waits: dict[str, float] = {}
        for fid, f in waiting.items():
            head = f.head()
            waits[fid] = max(0.0, loop_now - head.enqueued_at) if head is not None else 0.0
        s_lo, s_hi = min(services.values()), max(services.values())
        w_lo, w_hi = min(waits.values()), max(waits.values())
        p = self.params
        best = max(sorted(waiting), key=lambda fid: (
            p.las_weight_service * (1 - _norm(services[fid], s_lo, s_hi))
            + p.las_weight_head_wait * _norm(waits[fid], w_lo, w_hi)))
        # The flow controller releases the head of the flow picked here, so its wait is
        # known now (upstream stashes the head's enqueue time at its pick for the same).
        self._waited(best, waits[best], now)
        return waiting[best]

    # -- accounting (the flow controller calls these) ----------------------------------

    def started(self, fairness_id: str, prompt_tokens: int) -> None:
        """Upstream counts attained service at completion only."""

    def served(self, fairness_id: str, prompt_tokens: int, completion_tokens: int,
               cached_tokens: int, estimated_prompt_tokens: int) -> None:
        """A response of ``fairness_id`` completed with this ``usage``."""
        now = self.clock()
        prog = self.programs.setdefault(fairness_id, _Program(anchor=now))
        prog.service += INPUT_TOKEN_WEIGHT * prompt_tokens + OUTPUT_TOKEN_WEIGHT * completion_tokens
        prog.anchor = prog.last_completion = now
        attained_service_gauge().labels(fairness_id).set(prog.service)

    # -- internals ---------------------------------------------------------------------

    def _waited(self, fairness_id: str, seconds: float, now: float) -> None:
        prog = self.programs.get(fairness_id)
        if prog is None:
            prog = self.programs[fairness_id] = _Program(anchor=now, last_completion=now)
        prog.waits += 1
        # Whole milliseconds, as upstream measures them.
        prog.avg_wait_ms += (math.floor(seconds * 1000) - prog.avg_wait_ms) / prog.waits
        avg_wait_gauge().labels(fairness_id).set(prog.avg_wait_ms)
        fairness_index_gauge().set(
            jains_index([q.avg_wait_ms for q in self.programs.values() if q.waits]))

    def _decay_idle(self, band: Band, waiting: dict[str, FlowQueue], now: float) -> None:
        p = self.params
        for fid, prog in self.programs.items():
            if fid in waiting or band.inflight.get(fid):
                continue
            if p.las_half_life_seconds > 0:
                elapsed = now - prog.anchor
                if elapsed > 0:
                    prog.service *= 0.5 ** (elapsed / p.las_half_life_seconds)
                    prog.anchor = now
            else:
                prog.service *= p.las_decay_factor

    def _sweep(self, band: Band, now: float) -> None:
        self._next_sweep = now + self.params.eviction_sweep_seconds
        ttl = self.params.eviction_ttl_seconds
        for fid in [fid for fid, prog in self.programs.items()
                    if now - prog.last_completion >= ttl and not band.inflight.get(fid)
                    and fid not in band.flows]:
            del self.programs[fid]
            for gauge in (attained_service_gauge(), avg_wait_gauge()):
                with contextlib.suppress(KeyError):
                    gauge.remove(fid)


def _norm(x: float, lo: float, hi: float) -> float:
    return 0.5 if hi == lo else (x - lo) / (hi - lo)


def _loop_time() -> float:
    """Queue items carry event-loop times."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()
