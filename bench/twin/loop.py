"""The twin's discrete-event loop: a fleet of simulator engines in virtual time.

Events, in time order (ties broken by kind, then by insertion):

- **step end** of a server: :meth:`sim.engine.Engine.finish_step` (tokens, first tokens,
  finishes), then the next step begins at once if the engine has work - exactly what the
  simulator's asyncio driver (``sim.runner.EngineLoop``) and ``sim.clock.run_virtual`` do;
- **scrape** of a server (only for routers that read metrics): the engine's gauges are read at
  the scrape's start and handed to the router ``scrape_latency`` later, each server on its own
  phase of the ``interval`` - so the router sees numbers as stale as a real scrape's;
- **arrival** of a request: the router picks a server (its in-flight count goes up), the
  server's engine queues the request and starts a step if it was idle. A router that models
  its own CPU (``pick_done``, :mod:`bench.twin.cpu` in :mod:`bench.twin.replicas`) says when
  the pick is done instead, and a **pick** event at that time does the above. A router with
  a process CPU model (``cpu``, :class:`bench.twin.cpu.ProcessCpu`) pays for each pick and
  each streamed token on it: the pick waits for the process, and the client sees a token when
  the process has passed it on.

A request leaves the router's in-flight accounting when its last token is out. Times are model
seconds; nothing sleeps, so one seed gives the same outcomes every time.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from bench.openloop import Outcome
from bench.twin.cpu import ProcessCpu
from bench.workloads import RequestSpec
from sim.engine import Engine, QueueFull, SimRequest
from sim.kvevents import BlockHasher, KVEventRecorder
from sim.openai import ApiError, parse_request
from sim.profiles import Profile, get_profile

# Event kinds, in the order they run at equal times: a step's tokens are out before a scrape
# taken at the same instant reads the engine, and both before an arrival is routed.
STEP, SCRAPE_START, SCRAPE_DONE, ARRIVAL, PICK = 0, 1, 2, 3, 4


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

    def done(self, index: int, prompt_tokens: int, completion_tokens: int) -> None:
        """Request ``index`` finished (its last token is out)."""
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
        stats: dict[str, float] | None = None) -> list[Outcome]:
    """Play ``specs`` (arrival times in model seconds) through ``router`` onto the fleet;
    one :class:`bench.openloop.Outcome` per request (times in model seconds). ``stats``
    gets the fleet's figures (``evictions``: blocks the servers evicted)."""
    profile: Profile = get_profile(config.profile)
    if config.kv_blocks:
        profile = dataclasses.replace(profile, num_gpu_blocks=config.kv_blocks)
    keys = config.keys()
    speeds = config.speeds or (1.0,) * len(keys)
    # A router with a precise prefix scorer reads each engine step's KV events at its end.
    sink: Callable[[str, list[Any]], None] | None = getattr(router, "kv_events", None)
    engines = {k: Engine(profile, seed=config.seed + i, time_scale=1.0 / speeds[i],
                         kv_events=None if sink is None else KVEventRecorder(
                             functools.partial(sink, k)),
                         block_hasher=None if sink is None else BlockHasher("sha256"))
               for i, k in enumerate(keys)}
    busy: dict[str, bool] = dict.fromkeys(keys, False)
    outcomes = [Outcome(index=i, start=s.at) for i, s in enumerate(specs)]
    owner: dict[int, tuple[int, str]] = {}   # id(SimRequest) -> (request index, server)
    events: list[tuple[float, int, int, str]] = []   # (time, kind, seq, payload)
    seq = 0
    cpu: ProcessCpu | None = getattr(router, "cpu", None)

    def push(t: float, kind: int, payload: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, kind, seq, payload))

    for i, s in enumerate(specs):
        push(s.at, ARRIVAL, str(i))
    last_arrival = max((s.at for s in specs), default=0.0)
    if router.scrape_interval:
        phase = random.Random(f"scrape:{config.seed}")
        for k in keys:
            push(phase.uniform(0, router.scrape_interval), SCRAPE_START, k)

    def on_event(key: str) -> object:
        def hook(kind: str, req: SimRequest, t: float) -> None:
            idx = owner.get(id(req))
            if idx is None:
                return
            out = outcomes[idx[0]]
            if kind == "first_token" or kind == "token":
                seen = t if cpu is None else cpu.run(t, cpu.per_token)
                if kind == "first_token":
                    out.ttft = seen - out.start
                out.e2e = seen - out.start   # the last token's is the request's
            elif kind == "finish":
                out.status = 200
                out.output_tokens = req.generated
                out.prompt_tokens = req.prompt_tokens
                out.cached_tokens = req.cached_tokens
                del owner[id(req)]
                router.done(idx[0], req.prompt_tokens, req.generated)
        return hook

    for k, e in engines.items():
        e.on_event = on_event(k)  # type: ignore[assignment]

    def start_step(key: str, now: float) -> None:
        engine = engines[key]
        end = engine.begin_step(now)
        if end == now and not engine.running:
            engine.finish_step()   # blocked: nothing fits until something changes
            busy[key] = False
            return
        busy[key] = True
        push(end, STEP, key)

    readings: dict[str, ServerState] = {}
    admit = _admit(config.model, owner)
    pending = len(specs)
    # A router with background work of its own (replicas syncing a shared store,
    # bench.twin.replicas) catches up to each event's time before it runs.
    advance: Callable[[float], None] | None = getattr(router, "advance", None)
    # A router with a CPU model: (request index, arrival time) -> when its pick is done.
    pick_done: Callable[[int, float], float] | None = getattr(router, "pick_done", None)
    if cpu is not None:
        pick_done = cpu.pick_done
    while events:
        t, kind, _, payload = heapq.heappop(events)
        if advance is not None:
            advance(t)
        if kind == STEP:
            engine = engines[payload]
            engine.finish_step()
            busy[payload] = False
            if engine.has_work:
                start_step(payload, t)
        elif kind == SCRAPE_START:
            if pending == 0 and t > last_arrival:
                continue   # nothing left to route: stop scraping
            router.begin_scrape(payload)
            push(t + config.scrape_latency, SCRAPE_DONE, payload)
            push(t + (router.scrape_interval or 0.0), SCRAPE_START, payload)
            readings[payload] = server_state(engines[payload])
        elif kind == SCRAPE_DONE:
            router.scraped(payload, readings.pop(payload))
        elif kind == ARRIVAL and pick_done is not None:
            push(pick_done(int(payload), t), PICK, payload)
        else:
            pending -= 1
            i = int(payload)
            body = orjson.dumps(specs[i].body)
            try:
                key = router.route(i, specs[i].path, body, t, specs[i].headers)
            except Refused as e:
                outcomes[i].status, outcomes[i].error = e.status, str(e)
                continue
            outcomes[i].pod = key
            error = admit(engines[key], i, key, body, specs[i].path, t)
            if error:
                outcomes[i].status, outcomes[i].error = error
                router.done(i, 0, 0)
            elif not busy[key]:
                start_step(key, t)
    if stats is not None:
        stats["evictions"] = sum(e.kv.evictions for e in engines.values())
    return outcomes


def _admit(model: str, owner: dict[int, tuple[int, str]]) -> Callable[
        [Engine, int, str, bytes, str, float], tuple[int, str] | None]:
    """Queue a routed request on its server the way ``sim.server`` does; returns
    (status, error) when the server refuses it."""
    def admit(engine: Engine, i: int, key: str, body: bytes, path: str,
              now: float) -> tuple[int, str] | None:
        try:
            parsed = parse_request(body, chat=path.endswith("/chat/completions"))
        except ApiError as exc:
            return exc.status, str(exc)
        lora = None if parsed.model == model else parsed.model
        max_tokens = parsed.max_tokens or engine.profile.default_max_tokens
        req = engine.new_request(parsed.prompt, max_tokens, lora=lora, now=now,
                                 salt=parsed.cache_salt, request_id=str(i))
        req.mm_hashes = parsed.mm_hashes
        owner[id(req)] = (i, key)
        try:
            engine.add(req)
        except QueueFull as exc:
            del owner[id(req)]
            return 429, str(exc)
        except ValueError as exc:
            del owner[id(req)]
            return 400, str(exc)
        return None
    return admit
