"""Runs an :class:`~sim.engine.Engine` in real time: one asyncio task per simulated server.

The task sleeps until the end of each step and then wakes every request that got a token; no
per-request or per-token timers exist. Steps are laid on a timeline: the next step starts where
the previous one *should* have ended, not when the task actually woke, so event-loop lag does
not stretch the simulated throughput (tokens are delivered a little late instead).
"""

from __future__ import annotations

import asyncio
import contextlib

from sim.engine import Engine

#: If the loop falls this far behind the timeline, give up catching up (resynchronise).
_MAX_LAG = 0.5


class EngineLoop:
    """The asyncio driver of one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.max_lag = 0.0

    def start(self) -> None:
        """Start the driver task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        """Stop the driver task."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def notify(self) -> None:
        """Tell the driver new work (or an abort) arrived."""
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        timeline: float | None = None  # planned end of the previous step while busy
        while True:
            if not engine.has_work:
                timeline = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            start = now if timeline is None or now - timeline > _MAX_LAG else timeline
            end = engine.begin_step(start)
            if end == start and not engine.running:
                # Nothing could be scheduled (KV cache full of waiting work): wait for change.
                engine.finish_step()
                timeline = None
                self._wake.clear()
                await self._wake.wait()
                continue
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.max_lag = max(self.max_lag, -delay)
                await asyncio.sleep(0)  # behind schedule: still let handlers write tokens
            engine.finish_step()
            timeline = end
