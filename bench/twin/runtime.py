"""The twin's runtime engine: the real EPP runtime (director, scheduler, every plugin, the
flow controller, the latency model) in front of a fleet of the simulator's engines
(:class:`sim.engine.Engine`) on one virtual clock, scraped every 50 ms. Nothing sleeps, so a
run of thousands of requests takes seconds and every seed is reproducible.

:func:`bench.runner` plays a scenario's EPP contenders here when they need more than the
director alone (:mod:`bench.twin.loop`): flow control (its admitter awaits: an asyncio loop
on :mod:`bench.twin.vtime`'s clock), a ``predicted-latency-producer`` (it learns from
streamed tokens and retrains on the virtual clock), or per-server speeds. Time the EPP would
add on the wire is not modelled (the twin measures scheduling quality).
"""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.twin.vtime import RESOLUTION, run_in_virtual_time
from bench.workloads import objective_manifests
from devkit.manifests import pool_manifests
from epp.config import build, parse_config
from epp.datastore import Datastore, EndpointMetrics
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.latency.predictions import predictions_of
from epp.requestcontrol import Director, Routed
from epp.requestcontrol.plugins.predicted_latency_producer import (
    PredictedLatencyProducer,
    predicted_tpot,
)
from shared.errors import GatewayError
from sim.engine import Engine, SimRequest
from sim.profiles import H100_8B, Profile

FLEET = 4
SCRAPE = 0.05
RETRAIN = 1.0


@dataclass(slots=True)
class Done:
    """One request's outcome (model seconds) and the producer's predictions for the endpoint
    it was sent to (None: no producer)."""

    tag: str
    arrival: float
    ttft: float
    tpot: float | None
    prompt_tokens: int
    out_tokens: int
    finish: float
    #: the engine that served it
    engine: int
    predicted_ttft: float | None = None
    predicted_tpot: float | None = None
    #: the quantile (p90) predictions
    predicted_ttft_q: float | None = None
    predicted_tpot_q: float | None = None
    #: the predicted TPOT the producer reports (the pick's and the in-stream ones' mean)
    reported_tpot: float | None = None


@dataclass(order=True, slots=True)
class Arrival:
    at: float
    seq: int
    body: dict[str, Any] = field(compare=False)
    headers: dict[str, str] = field(compare=False)
    tag: str = field(compare=False, default="")


class Twin:
    """A fleet of engines on one virtual clock behind a real EPP runtime."""

    def __init__(self, config: str | None, seed: int, fleet: int = FLEET,
                 profile: Profile = H100_8B, speeds: Sequence[float] = ()) -> None:
        """``speeds``: per server, its speed relative to ``profile`` (0.5: every step takes
        twice as long; the engine's ``time_scale`` is 1 / speed); empty: all 1."""
        self.engines = [Engine(profile, seed=seed * 100 + i,
                               time_scale=1.0 / speeds[i] if speeds else 1.0)
                        for i in range(fleet)]
        pods = [(f"pod-{i}", f"10.9.0.{i + 1}") for i in range(fleet)]
        objects = [parse_object(d) for d in pool_manifests("pool", pods, 8000,
                                                             objective_manifests("pool"))]
        self.datastore = Datastore()
        self.datastore.replace(build_snapshot([o for o in objects if o is not None],
                                              pool_name="pool", pool_namespace="default"))
        self.runtime = build(parse_config(config), self.datastore, rng=random.Random(seed))
        self.director = Director.of(self.runtime)
        self.producers = self.runtime.handle.find(PredictedLatencyProducer)
        for p in self.producers:
            p.predictor.stop()  # retrained on the virtual clock instead (deterministic),
            p.predictor.executor = None  # in this thread
        views = {v.key: v for v in self.datastore.views()}
        self.by_key = {f"10.9.0.{i + 1}:8000": i for i in range(fleet)}
        self.views = [views[k] for k in sorted(self.by_key, key=self.by_key.__getitem__)]
        self.step_end: list[float | None] = [None] * fleet
        self.inflight: dict[str, tuple[Routed, Arrival, SimRequest]] = {}
        self.pending: list[Arrival] = []
        self.done: list[Done] = []
        self.refused = 0
        self.now = 0.0
        self._seq = 0
        #: Per engine, set when a request joins it (:meth:`run_async` only).
        self._wake: list[asyncio.Event] | None = None
        for e in self.engines:
            e.on_event = self._on_event

    def add(self, at: float, body: dict[str, Any], headers: dict[str, str] | None = None,
            tag: str = "") -> None:
        self._seq += 1
        heapq.heappush(self.pending, Arrival(at, self._seq, body, headers or {}, tag))

    def _on_event(self, kind: str, req: SimRequest, t: float) -> None:
        entry = self.inflight.get(req.id)
        if entry is None:
            return
        routed, arrival, _ = entry
        if kind in ("first_token", "token"):  # one streamed chunk per token
            if kind == "first_token":
                routed.response.ttft = t - arrival.at
            for plugin in self.runtime.response_streaming:
                plugin.response_streaming(routed.request, routed.response, b"", routed.endpoint)
        elif kind == "finish":
            del self.inflight[req.id]
            self._finish(routed, arrival, req, t)

    def _finish(self, routed: Routed, arrival: Arrival, req: SimRequest, t: float) -> None:
        r = routed.response
        r.completed, r.status, r.size = True, 200, 1
        r.prompt_tokens, r.completion_tokens = req.prompt_tokens, req.generated
        r.elapsed = t - arrival.at
        ttft = r.ttft if r.ttft is not None else r.elapsed
        r.tpot = (r.elapsed - ttft) / (req.generated - 1) if req.generated > 1 else None
        for plugin in self.runtime.response_complete:
            plugin.response_complete(routed.request, r, routed.endpoint)
        preds = predictions_of(routed.request)
        p = preds.by_endpoint.get(routed.endpoint.key) if preds is not None else None
        self.done.append(Done(
            arrival.tag, arrival.at, ttft, r.tpot, req.prompt_tokens, req.generated, t,
            self.by_key[routed.endpoint.key],
            *((p.ttft, p.tpot, p.ttft_q, p.tpot_q) if p else (None,) * 4),
            predicted_tpot(preds) if preds is not None else None))

    def _scrape(self) -> None:
        real = time.monotonic()
        for e, v in zip(self.engines, self.views, strict=True):
            v.begin_scrape()
            self.datastore.record_scrape(v, EndpointMetrics(
                waiting=e.num_waiting, running=e.num_running, kv_usage=e.kv.usage,
                updated_at=real))

    def _route(self, a: Arrival) -> None:
        body = orjson.dumps(a.body)
        headers = {":path": "/v1/completions", "x-request-id": f"r{a.seq}", **a.headers}
        try:
            _, routed = self.director.route(headers, body, {})
        except GatewayError:
            self.refused += 1
            return
        self._start(a, routed)

    def _start(self, a: Arrival, routed: Routed) -> None:
        """The response side opens and the request joins its engine's queue (now)."""
        self.director.response_received(routed, 200, {"content-type": "text/event-stream"})
        i = self.by_key[routed.endpoint.key]
        e = self.engines[i]
        req = e.new_request(a.body["prompt"].encode(), a.body["max_tokens"], now=self.now,
                            request_id=f"r{a.seq}")
        req.arrival = self.now
        self.inflight[req.id] = (routed, a, req)
        e.add(req)
        if self._wake is not None:
            self._wake[i].set()

    async def _route_async(self, a: Arrival) -> None:
        """One request through the director as the ext_proc exchange drives it: prepare,
        admit (flow control may hold it here), dispatch; then queued on its engine."""
        body = orjson.dumps(a.body)
        headers = {":path": "/v1/completions", "x-request-id": f"r{a.seq}", **a.headers}
        director = self.director
        try:
            pending = director.prepare(headers, body, {})
            await director.admit(pending)
            _, routed = director.dispatch(pending)
        except GatewayError:
            self.refused += 1
            return
        self._start(a, routed)

    async def run_async(self) -> None:
        """The same fleet as :meth:`run_sync`, as asyncio tasks on the running loop's clock
        (:func:`bench.twin.vtime.run_in_virtual_time`): one task per engine (a step, then
        the next while it has work), the scrape and retrain schedules, and one task per
        arrival that awaits the director's admitters - the real flow controller and its
        dispatcher run on the same loop."""
        loop = asyncio.get_running_loop()
        wake = [asyncio.Event() for _ in self.engines]
        self._wake = wake
        routing: set[asyncio.Task[None]] = set()

        def clock() -> float:
            self.now = loop.time()
            return self.now

        async def engine(i: int) -> None:
            e = self.engines[i]
            while True:
                if not e.has_work:
                    wake[i].clear()
                    await wake[i].wait()
                    continue
                now = clock()
                end = e.begin_step(now)
                if end == now and not e.running:
                    e.finish_step()  # blocked until something frees
                    wake[i].clear()
                    await wake[i].wait()
                    continue
                await asyncio.sleep(end - now)
                clock()
                e.finish_step()

        async def every(interval: float, first: float, tick: Callable[[], None]) -> None:
            await asyncio.sleep(first)
            while True:
                clock()
                tick()
                await asyncio.sleep(interval)

        def retrain() -> None:
            for p in self.producers:
                p.predictor.retrain()

        background = [loop.create_task(engine(i)) for i in range(len(self.engines))]
        background.append(loop.create_task(every(SCRAPE, 0.0, self._scrape)))
        background.append(loop.create_task(every(RETRAIN, RETRAIN, retrain)))
        try:
            while self.pending or self.inflight or routing:
                # Due within the clock's resolution: a shorter sleep would not move the
                # clock (asyncio runs a timer that close at once), so it would never be due.
                if self.pending and self.pending[0].at <= clock() + RESOLUTION:
                    task = loop.create_task(self._route_async(heapq.heappop(self.pending)))
                    routing.add(task)
                    task.add_done_callback(routing.discard)
                    continue
                wait = self.pending[0].at - self.now if self.pending else SCRAPE
                await asyncio.sleep(min(wait, SCRAPE))
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            if self.runtime.flow_control is not None:  # its dispatcher task ends too
                await self.runtime.flow_control.aclose()
            self._wake = None

    def run(self) -> None:
        """Play every arrival to its end: :meth:`run_async` on a virtual-time event loop when
        the runtime has flow control (its queues wait on asyncio), else :meth:`run_sync`."""
        if self.runtime.flow_control is not None:
            run_in_virtual_time(self.run_async())
        else:
            self.run_sync()

    def run_sync(self) -> None:
        """The discrete-event loop (no event loop: the director's admitters never wait)."""
        next_scrape, next_retrain = 0.0, RETRAIN
        while self.pending or self.inflight:
            candidates = [next_scrape, next_retrain]
            if self.pending:
                candidates.append(self.pending[0].at)
            candidates += [s for s in self.step_end if s is not None]
            self.now = now = min(candidates)
            for i, e in enumerate(self.engines):
                if self.step_end[i] == now:
                    self.step_end[i] = None
                    e.finish_step()
            if now >= next_scrape:
                self._scrape()
                next_scrape = now + SCRAPE
            if now >= next_retrain:
                for p in self.producers:
                    p.predictor.retrain()
                next_retrain = now + RETRAIN
            while self.pending and self.pending[0].at <= now:
                self._route(heapq.heappop(self.pending))
            for i, e in enumerate(self.engines):
                if self.step_end[i] is None and e.has_work:
                    end = e.begin_step(now)
                    if end == now and not e.running:
                        e.finish_step()  # blocked until something frees
                    else:
                        self.step_end[i] = end
            if not self.pending and not self.inflight:
                break
