"""Clocks: the asyncio clock for servers, a virtual clock and driver for deterministic tests."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Iterable
from typing import Protocol

from sim.engine import Engine, QueueFull, SimRequest


class Clock(Protocol):
    """Source of engine time in seconds (monotonic)."""

    def now(self) -> float: ...


class LoopClock:
    """The running asyncio loop's monotonic clock (what ``asyncio.sleep`` is measured in)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()

    def now(self) -> float:
        """Current loop time."""
        return self._loop.time()


class VirtualClock:
    """A clock that only moves when told to; tests never sleep."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        """Current virtual time."""
        return self.t

    def advance_to(self, t: float) -> None:
        """Move forward to ``t`` (never backwards)."""
        self.t = max(self.t, t)


#: An arrival for :func:`run_virtual`: at time ``t`` call ``make(t)``; it returns the request to
#: queue (already built with ``Engine.new_request``) or ``None`` to queue nothing.
Arrival = tuple[float, Callable[[float], SimRequest | None]]


def run_virtual(
    engine: Engine,
    arrivals: Iterable[Arrival],
    clock: VirtualClock | None = None,
    *,
    until: float | None = None,
    on_reject: Callable[[SimRequest, Exception], None] | None = None,
) -> VirtualClock:
    """Drive ``engine`` on a virtual clock until every arrival is served (or ``until``).

    Requests arriving while a step runs wait for the next step, as on a real server.
    """
    clock = clock or VirtualClock()
    pending = [(t, i, make) for i, (t, make) in enumerate(arrivals)]
    heapq.heapify(pending)

    def admit_until(t: float) -> None:
        while pending and pending[0][0] <= t:
            at, _, make = heapq.heappop(pending)
            req = make(at)
            if req is None:
                continue
            req.arrival = at
            try:
                engine.add(req)
            except (QueueFull, ValueError) as exc:  # queue cap or a request that never fits
                if on_reject is None:
                    raise
                on_reject(req, exc)

    while True:
        if until is not None and clock.now() >= until:
            break
        admit_until(clock.now())
        if engine.has_work:
            end = engine.begin_step(clock.now())
            if end == clock.now() and not engine.running:
                # Blocked (nothing fits); only a new arrival can change that.
                engine.finish_step()
                if not pending:
                    break
                clock.advance_to(pending[0][0])
                continue
            admit_until(end)
            clock.advance_to(end)
            engine.finish_step()
        elif pending:
            clock.advance_to(pending[0][0])
        else:
            break
    return clock
