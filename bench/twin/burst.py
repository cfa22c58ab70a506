"""The EPP with a ``burst-prefix-cache-producer`` in virtual time: a request's pick waits for
the end of its window (``pick_done``, so the wait counts in TTFT), then the window's requests
are placed together as the plugin does. :func:`bench.runner` uses it for a contender whose
EndpointPickerConfig names that producer (``bench/scenarios/v010-burst-prefix.yaml``).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import orjson

from bench.twin.epp_adapter import EppRouter
from bench.twin.loop import Refused
from bench.workloads import RequestSpec
from epp.requestcontrol.director import DESTINATION, Pending
from epp.requestcontrol.plugins.burst_prefix_cache_producer import BurstPrefixCacheProducer
from shared.errors import GatewayError


class WindowedRouter(EppRouter):
    """:class:`EppRouter` whose picks wait for their burst window to close."""

    def __init__(self, *args: Any, specs: list[RequestSpec], **kw: Any) -> None:
        super().__init__(*args, **kw)
        (self.burst,) = self.director.runtime.handle.find(BurstPrefixCacheProducer)
        self.specs = specs
        window = self.burst.params.window_duration_ms / 1000.0
        self.window_end: dict[int, float] = {}
        self.members: dict[float, list[int]] = defaultdict(list)
        self.ready: dict[int, Pending] = {}
        end = -1.0
        for i, s in enumerate(specs):  # a window opens at the first arrival after the last
            if s.at >= end:
                end = s.at + window
            self.window_end[i] = end
            self.members[end].append(i)

    def pick_done(self, index: int, arrival: float) -> float:
        return self.window_end[index]

    def route(self, index: int, path: str, body: bytes, now: float,
              headers: Mapping[str, str]) -> str:
        if index not in self.ready:
            self._place(self.members[self.window_end[index]])
        try:
            decision, routed = self.director.dispatch(self.ready.pop(index))
        except GatewayError as e:
            raise Refused(e.status, str(e)) from None
        self._routed[index] = routed
        return decision.set_headers[DESTINATION]

    def _place(self, indexes: list[int]) -> None:
        pendings = {}
        for i in indexes:
            spec = self.specs[i]
            headers = {**spec.headers, ":path": spec.path, ":method": "POST",
                       "content-type": "application/json", "x-request-id": f"twin-{i}"}
            pendings[i] = self.director.prepare(headers, orjson.dumps(spec.body), {})

        async def window() -> None:
            waits = [self.burst.admit(p.request, p.candidates) for p in pendings.values()]
            if self.burst._window is not None:
                self.burst._seal(self.burst._window)  # virtual time: the window is over now
            await asyncio.gather(*(w for w in waits if w is not None))

        asyncio.run(window())
        self.ready.update(pendings)
