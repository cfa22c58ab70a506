"""The twin's one engine: a fleet of simulator engines in virtual time behind a router (the
real EPP runtime, Envoy's policies re-stated, or active-active EPP replicas).

Events, in time order (ties broken by kind, then by insertion):

- **step end** of a server: :meth:`sim.engine.Engine.finish_step` (tokens, first tokens,
  finishes), then the next step begins at once if the engine has work - exactly what the
  simulator's asyncio driver (``sim.runner.EngineLoop``) and ``sim.clock.run_virtual`` do;
- **scrape** of a server (only for routers that read metrics): the engine's gauges are read at
  the scrape's start and handed to the router ``scrape_latency`` later, each server on its own
  phase of the ``interval`` - so the router sees numbers as stale as a real scrape's;
- **arrival** of a request: the router picks a server (its in-flight count goes up), the
  server's engine queues the request and starts a step if it was idle. A router that models
  its CPU (``pick_done``: an EPP with a :class:`bench.twin.cpu.ProcessCpu`, or replicas each
  with their own) says when the pick is done instead, and a **pick** event at that time does
  the above; its ``token`` hook says when the client sees each streamed token (when the
  process has passed it on);
- **retrain** (routers with a latency model, ``retrain``): every ``retrain_interval`` model
  seconds, in this thread, so a seed is one run.

A request leaves the router's in-flight accounting when its last token is out; a router with
response hooks (``token``) sees every streamed token at its virtual time. A router whose
admitters may wait (``route_async``: flow control's queues, a burst producer's windows) is
played on an asyncio event loop whose clock is model seconds and jumps to the next timer
(`looptime`_): the events are the same, and the admitters await on that clock in between.
Times are model seconds; nothing sleeps, so one seed gives the same outcomes every time.

.. _looptime: https://pypi.org/project/looptime/
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import heapq
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import looptime
import orjson

from bench.openloop import Outcome
from bench.workloads import SLO_TPOT_HEADER, SLO_TTFT_HEADER, RequestSpec
from sim.engine import Engine, QueueFull, SimRequest
from sim.kvevents import BlockHasher, KVEventRecorder
from sim.openai import ApiError, parse_request
from sim.profiles import Profile, get_profile

# Event kinds, in the order they run at equal times: a step's tokens are out before a scrape
# taken at the same instant reads the engine, and both before an arrival is routed.
STEP, SCRAPE_START, SCRAPE_DONE, ARRIVAL, PICK, RETRAIN = 0, 1, 2, 3, 4, 5
#: looptime rounds its clock to this many seconds (a model-time microsecond).
RESOLUTION = 1e-6
T = TypeVar("T")


@dataclass(slots=True)
class TwinOutcome(Outcome):
    """A request as the twin saw it, with the EPP's predictions for the picked endpoint
    (central and p90 quantile; ``reported_tpot``: what the producer reports, its pick's and
    in-stream predictions' mean) and the request's SLO, seconds (None: none);
    :func:`bench.report.summarize` judges them."""

    predicted_ttft: float | None = None
    predicted_tpot: float | None = None
    predicted_ttft_q: float | None = None
    predicted_tpot_q: float | None = None
    reported_tpot: float | None = None
    slo_ttft: float | None = None
    slo_tpot: float | None = None


@dataclass(frozen=True, slots=True)
class ServerState:
    """What a model server's /metrics reports, in neutral terms (a scrape's reading)."""

    waiting: int
    running: int
    kv_usage: float
    max_lora: int
    running_adapters: frozenset[str]
    waiting_adapters: frozenset[str]
    block_size: int
    num_gpu_blocks: int


class Refused(Exception):
    """Raised by :meth:`Router.route` when the router answers the client itself (e.g. the
    EPP sheds a sheddable request with 429): the request reaches no server."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Router(Protocol):
    """A routing policy in the twin. Servers are named ``ip:port`` like real endpoints."""

    name: str
    #: Seconds between scrapes of each server (None: the router reads no metrics).
    scrape_interval: float | None

    def route(self, index: int, path: str, body: bytes, now: float,
              headers: Mapping[str, str]) -> str:
        """Pick the server for request ``index`` (``body`` and ``headers`` as the client
        sent them to ``path``); returns its key, or raises :class:`Refused`."""
        ...

    def done(self, index: int, prompt_tokens: int, completion_tokens: int,
             now: float) -> tuple[float | None, ...] | None:
        """Request ``index`` finished at ``now`` (its last token is out); returns the
        predictions for its endpoint (:class:`TwinOutcome`'s order) or None."""
        ...

    def begin_scrape(self, key: str) -> None:
        """A scrape of ``key`` is sent now."""
        ...

    def scraped(self, key: str, state: ServerState) -> None:
        """The scrape of ``key`` begun earlier came back with ``state``."""
        ...


@dataclass(frozen=True, slots=True)
class TwinConfig:
    """The fleet and the loop's knobs."""

    servers: int
    seed: int = 0
    profile: str = "8b-h100"
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    #: Model seconds a scrape takes to come back (the reading is from its start).
    scrape_latency: float = 0.002
    #: Per server, its speed relative to ``profile`` (the engine's ``time_scale`` is
    #: 1 / speed: 0.5 = every step takes twice as long); empty: all 1.
    speeds: tuple[float, ...] = ()
    #: each server's KV cache in blocks (0: the profile's)
    kv_blocks: int = 0

    def keys(self) -> list[str]:
        """Endpoint keys, the same addresses ``bench.runner.run_one``'s fleet uses."""
        return [f"127.0.10.{i + 1}:8000" for i in range(self.servers)]


def server_state(engine: Engine) -> ServerState:
    """A reading of ``engine``'s gauges, as ``sim.metrics`` exports them."""
    p = engine.profile
    return ServerState(engine.num_waiting, engine.num_running, engine.kv.usage, p.max_loras,
                       frozenset(engine.loras.running_adapters),
                       frozenset(engine.waiting_adapters), p.block_size, p.num_gpu_blocks)


def run(specs: Sequence[RequestSpec], router: Router, config: TwinConfig,
        stats: dict[str, float] | None = None) -> list[TwinOutcome]:
    """Play ``specs`` (arrival times in model seconds) through ``router`` onto the fleet;
    one :class:`TwinOutcome` per request (times in model seconds). ``stats`` gets the
    fleet's figures (``evictions``: blocks the servers evicted)."""
    play = _Play(specs, router, config)
    if getattr(router, "route_async", None) is not None:
        run_in_virtual_time(play.drive_async())
    else:
        while play.events:
            play.next_event()
    if stats is not None:
        stats["evictions"] = sum(e.kv.evictions for e in play.engines.values())
    return play.outcomes


def run_in_virtual_time(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a fresh event loop whose clock starts at 0 and only moves to the next
    scheduled timer (``loop.time()`` is model seconds; nothing sleeps). A loop with no timer
    left and nothing runnable (a twin that deadlocked: only outside I/O could wake it) fails
    every task with :class:`looptime.IdleTimeoutError` at once instead of hanging."""
    loop = looptime.new_event_loop(start=0.0, resolution=RESOLUTION, noop_cycles=1,
                                   idle_timeout=0.0)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def _outcome(i: int, spec: RequestSpec) -> TwinOutcome:
    """Request ``i`` before it is sent, with the SLO its headers set."""
    ttft, tpot = spec.headers.get(SLO_TTFT_HEADER), spec.headers.get(SLO_TPOT_HEADER)
    return TwinOutcome(index=i, start=spec.at, slo_ttft=float(ttft) / 1000 if ttft else None,
                       slo_tpot=float(tpot) / 1000 if tpot else None)


class _Play:
    """One run: the engines, the event heap, the outcomes (see the module docstring)."""

    def __init__(self, specs: Sequence[RequestSpec], router: Router,
                 config: TwinConfig) -> None:
        profile: Profile = get_profile(config.profile)
        if config.kv_blocks:
            profile = dataclasses.replace(profile, num_gpu_blocks=config.kv_blocks)
        keys = config.keys()
        speeds = config.speeds or (1.0,) * len(keys)
        # A router with a precise prefix scorer reads each engine step's KV events at its end.
        sink: Callable[[str, list[Any]], None] | None = getattr(router, "kv_events", None)
        self.engines = {k: Engine(profile, seed=config.seed + i, time_scale=1.0 / speeds[i],
                                  kv_events=None if sink is None else KVEventRecorder(
                                      functools.partial(sink, k)),
                                  block_hasher=None if sink is None else BlockHasher("sha256"))
                        for i, k in enumerate(keys)}
        for e in self.engines.values():
            e.on_event = self._on_event
        self.specs, self.router, self.config = specs, router, config
        self.busy: dict[str, bool] = dict.fromkeys(keys, False)
        self.outcomes = [_outcome(i, s) for i, s in enumerate(specs)]
        self.owner: dict[int, int] = {}   # id(SimRequest) -> request index
        self.events: list[tuple[float, int, int, str]] = []   # (time, kind, seq, payload)
        self.seq = 0
        #: optional router hooks: a streamed token (returns when the client sees it),
        #: background work caught up to each event's time (replicas syncing a store), a
        #: pick that takes time, retraining
        self.token: Callable[[int, float, bool], float] | None = getattr(router, "token", None)
        self.advance: Callable[[float], None] | None = getattr(router, "advance", None)
        self.pick_done: Callable[[int, float], float] | None = getattr(router, "pick_done", None)
        self.retrain: Callable[[], None] | None = getattr(router, "retrain", None)
        self.readings: dict[str, ServerState] = {}
        self.pending = len(specs)   # requests not yet routed (or refused)
        self.last_arrival = max((s.at for s in specs), default=0.0)
        self.tasks: set[asyncio.Task[None]] = set()
        self.wake: asyncio.Event | None = None
        self.error: BaseException | None = None
        for i, s in enumerate(specs):
            self.push(s.at, ARRIVAL, str(i))
        if router.scrape_interval:
            phase = random.Random(f"scrape:{config.seed}")
            for k in keys:
                self.push(phase.uniform(0, router.scrape_interval), SCRAPE_START, k)
        if self.retrain is not None:
            self.push(router.retrain_interval, RETRAIN, "")  # type: ignore[attr-defined]

    def push(self, t: float, kind: int, payload: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def _on_event(self, kind: str, req: SimRequest, t: float) -> None:
        i = self.owner.get(id(req))
        if i is None:
            return
        out = self.outcomes[i]
        if kind == "first_token" or kind == "token":
            seen = t if self.token is None else self.token(i, t, kind == "first_token")
            if kind == "first_token":
                out.ttft = seen - out.start
            out.e2e = seen - out.start   # the last token's is the request's
        elif kind == "finish":
            out.status = 200
            out.output_tokens = req.generated
            out.prompt_tokens = req.prompt_tokens
            out.cached_tokens = req.cached_tokens
            del self.owner[id(req)]
            predicted = self.router.done(i, req.prompt_tokens, req.generated, t)
            if predicted is not None:
                (out.predicted_ttft, out.predicted_tpot, out.predicted_ttft_q,
                 out.predicted_tpot_q, out.reported_tpot) = predicted

    def start_step(self, key: str, now: float) -> None:
        engine = self.engines[key]
        end = engine.begin_step(now)
        if end == now and not engine.running:
            engine.finish_step()   # blocked: nothing fits until something changes
            self.busy[key] = False
            return
        self.busy[key] = True
        self.push(end, STEP, key)

    def next_event(self) -> None:
        """Run the earliest event."""
        t, kind, _, payload = heapq.heappop(self.events)
        router = self.router
        if self.advance is not None:
            self.advance(t)
        if kind == STEP:
            engine = self.engines[payload]
            engine.finish_step()
            self.busy[payload] = False
            if engine.has_work:
                self.start_step(payload, t)
        elif kind in (SCRAPE_START, RETRAIN):
            if self.pending == 0 and t > self.last_arrival:
                return   # nothing left to route: stop scraping and learning
            if kind == RETRAIN:
                assert self.retrain is not None
                self.retrain()
                self.push(t + router.retrain_interval, RETRAIN, "")  # type: ignore[attr-defined]
                return
            router.begin_scrape(payload)
            self.push(t + self.config.scrape_latency, SCRAPE_DONE, payload)
            self.push(t + (router.scrape_interval or 0.0), SCRAPE_START, payload)
            self.readings[payload] = server_state(self.engines[payload])
        elif kind == SCRAPE_DONE:
            router.scraped(payload, self.readings.pop(payload))
        elif kind == ARRIVAL and self.pick_done is not None:
            self.push(self.pick_done(int(payload), t), PICK, payload)
        elif self.wake is not None:   # the admitters may wait: route on the event loop
            task = asyncio.get_running_loop().create_task(self._route_async(int(payload), t))
            self.tasks.add(task)
            task.add_done_callback(self._reap)
        else:
            self.pending -= 1
            i = int(payload)
            body = orjson.dumps(self.specs[i].body)
            try:
                key = router.route(i, self.specs[i].path, body, t, self.specs[i].headers)
            except Refused as e:
                self.outcomes[i].status, self.outcomes[i].error = e.status, str(e)
                return
            self.place(i, key, body, t)

    def place(self, i: int, key: str, body: bytes, t: float) -> None:
        """Request ``i``, routed to ``key``, joins its server's queue at ``t``."""
        self.outcomes[i].pod = key
        error = self._admit(self.engines[key], i, body, self.specs[i].path, t)
        if error:
            self.outcomes[i].status, self.outcomes[i].error = error
            self.router.done(i, 0, 0, t)
        elif not self.busy[key]:
            self.start_step(key, t)

    async def _route_async(self, i: int, t: float) -> None:
        body = orjson.dumps(self.specs[i].body)
        route: Callable[..., Awaitable[str]] = self.router.route_async  # type: ignore[attr-defined]
        try:
            key = await route(i, self.specs[i].path, body, self.specs[i].headers)
        except Refused as e:
            self.outcomes[i].status, self.outcomes[i].error = e.status, str(e)
            return
        finally:
            self.pending -= 1
        self.place(i, key, body, max(t, asyncio.get_running_loop().time()))
        assert self.wake is not None
        self.wake.set()   # the driver re-reads the heap: a step may now end sooner

    def _reap(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.error = task.exception()

    async def drive_async(self) -> None:
        """The events in time order on the running loop's clock; between them the routing
        tasks' admitters await (the flow controller and its dispatcher on the same loop)."""
        loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        try:
            while (self.events or self.tasks) and self.error is None:
                if self.events and self.events[0][0] <= loop.time() + RESOLUTION:
                    self.next_event()
                    continue
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(self.events[0][0] if self.events else None):
                        await self.wake.wait()
            if self.error is not None:
                raise self.error
        finally:
            for task in self.tasks:
                task.cancel()
            aclose: Callable[[], Awaitable[None]] | None = getattr(self.router, "aclose", None)
            if aclose is not None:
                await aclose()

    def _admit(self, engine: Engine, i: int, body: bytes, path: str,
               now: float) -> tuple[int, str] | None:
        """Queue a routed request on its server the way ``sim.server`` does; returns
        (status, error) when the server refuses it."""
        try:
            parsed = parse_request(body, chat=path.endswith("/chat/completions"))
        except ApiError as exc:
            return exc.status, str(exc)
        lora = None if parsed.model == self.config.model else parsed.model
        max_tokens = parsed.max_tokens or engine.profile.default_max_tokens
        req = engine.new_request(parsed.prompt, max_tokens, lora=lora, now=now,
                                 salt=parsed.cache_salt, request_id=str(i))
        req.mm_hashes = parsed.mm_hashes
        self.owner[id(req)] = i
        try:
            engine.add(req)
        except (QueueFull, ValueError) as exc:
            del self.owner[id(req)]
            return (429 if isinstance(exc, QueueFull) else 400), str(exc)
        return None
