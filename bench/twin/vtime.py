"""asyncio on a virtual clock, for the parts of the EPP that wait on the event loop.

The EPP's flow controller (:mod:`epp.flowcontrol`) holds requests in asyncio futures, times
them out with ``asyncio.timeout_at``, polls saturation with ``asyncio.timeout`` and reads
``loop.time()`` for enqueue times and SLO deadlines. To run that code unchanged in a twin, the
twin runs on an event loop whose ``time()`` is model seconds and that jumps straight to the
next timer whenever nothing is ready to run, instead of sleeping: `looptime`_'s fast-forward
loop. Nothing here re-implements flow control; the twin only drives the real controller.

.. _looptime: https://pypi.org/project/looptime/
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import looptime

T = TypeVar("T")

#: looptime rounds its clock to this many seconds (a model-time microsecond).
RESOLUTION = 1e-6


def run_in_virtual_time(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh event loop whose clock starts at 0 and only
    moves to the next scheduled timer (``loop.time()`` is model seconds; nothing sleeps).

    A loop with no timer left and nothing runnable (a twin that deadlocked: only outside I/O
    could wake it, and a twin has none) fails every task with
    :class:`looptime.IdleTimeoutError` at once instead of hanging.
    """
    loop = looptime.new_event_loop(start=0.0, resolution=RESOLUTION, noop_cycles=1,
                                   idle_timeout=0.0)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


__all__ = ["RESOLUTION", "run_in_virtual_time"]
