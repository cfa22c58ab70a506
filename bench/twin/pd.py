"""P/D fleets in virtual time: what ``python -m bench run`` plays for a scenario with
``fleet.roles`` and ``python -m bench advise`` sweeps (splits x rates).

A schedule is served by :class:`sim.engine.Engine` instances (the fleet's profile) on one
virtual clock: no HTTP, Envoy, EPP or sidecar, so the figures say what a split or a threshold
can reach at best.

- **aggregated**: ``P + D`` servers, each request to the one with the fewest outstanding
  requests (ties to the first).
- **P/D**: a prompt of at least ``nonCachedTokens`` tokens (nothing is cached in these mixes,
  so the decider's test is the prompt length) is prefilled on a prefill server (one output
  token), its KV pulled by a decode server after ``latency + tokens x 128 KiB / bandwidth``
  (the simulator's ``rdma`` link; pulls do not queue) and decoded there with only its last
  prompt token computed. Shorter prompts go to a decode server whole.

Picks (``prefill_pick`` / ``decode_pick``): ``least`` (fewest outstanding requests, what the
EPP's ``active-request-scorer`` does), ``tokens`` (fewest outstanding prompt tokens,
``token-load-scorer``), ``random`` (what llm-d's sample scorers amount to without prefix
hits). ``spill`` models our ``load-aware-pd-decider`` (:class:`Spill`); the decode server is
then picked at arrival, as the EPP does.

``encode`` (E/PD, E/P/D; issue #29): that many encode servers more. Each unique multimodal
item of a chat goes, as the sidecar sends it, to the least-loaded encoder as a one-item chat
with one output token (the encoder's engine runs the vision encoder unless the item is in its
cache); when every item is encoded the request goes on with its items loaded from the shared
store (``ec_load_time_per_image`` each). TTFT counts from arrival, encode leg included.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from bench.workloads import RequestSpec
from modelserver.multimodal import mm_items, unique_items
from sim.engine import Engine, SimRequest
from sim.openai import parse_request
from sim.pd import KV_BYTES_PER_TOKEN_8B, LINKS
from sim.profiles import H100_8B, Profile
from sim.tokenizer import count_tokens


@dataclass(eq=False)
class _Server:
    engine: Engine
    index: int
    outstanding: int = 0
    tokens: int = 0
    stepping: bool = False
    #: Requests placed here whose KV is still being prefilled elsewhere (the EPP counts
    #: them on the decode pod from the pick; only set with ``spill``).
    reserved: int = 0


@dataclass(frozen=True, slots=True)
class Served:
    """One client request as it ended: class, TTFT, TPOT (model seconds), its arrival and
    end (model seconds) and output tokens (for tok/s), and whether it was disaggregated."""

    long: bool
    ttft: float
    tpot: float
    arrival: float = 0.0
    end: float = 0.0
    output: int = 0
    disaggregated: bool = False
    prompt: int = 0


@dataclass(frozen=True, slots=True)
class Spill:
    """A load-aware decider: a prompt the length test would disaggregate is prefilled by its
    decode server instead when the least-loaded prefill server has at least
    ``prefill_tokens`` prompt tokens in flight (``None``: not tested) and the decode server
    has at most ``decode_requests`` requests in flight (``None``: not tested). In flight as
    ``inflight-load-producer`` counts: a prefill server from the pick to the end of the
    prefill leg, a decode server from the pick (at arrival, before the prefill leg) to the end
    of the request."""

    prefill_tokens: int | None = None
    decode_requests: int | None = None

    def local(self, prefill_backlog: int, decode_inflight: int) -> bool:
        """True: the decode server computes the prompt itself."""
        return ((self.prefill_tokens is None or prefill_backlog >= self.prefill_tokens)
                and (self.decode_requests is None or decode_inflight <= self.decode_requests))


#: What a request's end starts (the next leg, or the client's answer), with the request and
#: the time.
Then = Callable[[SimRequest, float], None]


@dataclass
class _Fleet:
    """Servers and the event queue of one virtual run: each event is what runs at its time
    (ties in the order they were pushed)."""

    seed: int
    events: list[tuple[float, int, Callable[[float], None]]] = field(default_factory=list)
    order: itertools.count[int] = field(default_factory=itertools.count)
    ids: itertools.count[int] = field(default_factory=itertools.count)
    rng: random.Random = field(default_factory=random.Random)
    #: request id -> what its end starts
    then: dict[str, Then] = field(default_factory=dict)

    def push(self, at: float, run: Callable[[float], None]) -> None:
        heapq.heappush(self.events, (at, next(self.order), run))

    def serve(self, s: _Server) -> None:
        """``s`` takes part: its finished requests start what they carry."""
        def finished(kind: str, req: SimRequest, t: float) -> None:
            if kind == "finish":
                s.outstanding -= 1
                s.tokens -= req.prompt_tokens
                self.then.pop(req.id)(req, t)
        s.engine.on_event = finished

    def kick(self, s: _Server, now: float) -> None:
        """Start the server's next step if it has work and is idle."""
        s.stepping = bool(s.engine.running or s.engine.waiting)
        if s.stepping:
            self.push(s.engine.begin_step(now), lambda t: self.step(s, t))

    def step(self, s: _Server, now: float) -> None:
        s.engine.finish_step()
        self.kick(s, now)

    def choose(self, servers: list[_Server], pick: str) -> _Server:
        """The server a ``pick`` policy chooses (ties: the first)."""
        if pick == "random":
            return self.rng.choice(servers)
        if pick == "tokens":
            return min(servers, key=lambda x: (x.tokens, x.index))
        # Requests whose KV is still being prefilled for this server count, as the EPP
        # counts them on the decode pod from the pick (only with ``spill``; 0 otherwise).
        return min(servers, key=lambda x: (x.outstanding + x.reserved, x.index))

    def submit(self, servers: list[_Server], prompt: int, out: int, arrival: float, now: float,
               then: Then, remote: int = 0, pick: str = "least", on: _Server | None = None,
               items: tuple[str, ...] = (), loaded: bool = False) -> None:
        """Queue a request on ``on``, else on the server ``pick`` chooses; ``then`` runs at its
        end. ``items``: its multimodal item hashes; ``loaded``: an encode server made them (EC
        load, no encode)."""
        s = on if on is not None else self.choose(servers, pick)
        rid = next(self.ids)
        req = SimRequest(id=str(rid), prompt_tokens=prompt,
                         block_hashes=[hash((self.seed, rid, b)) for b in range(prompt // 16)],
                         max_tokens=out, output_tokens=out, lora=None, arrival=arrival,
                         text_seed=rid, stream=False)
        req.remote_tokens = remote
        req.mm_hashes = items
        if loaded:
            req.remote_mm = frozenset(items)
        self.then[req.id] = then
        s.engine.add(req)
        s.outstanding += 1
        s.tokens += prompt
        if not s.stepping:
            self.kick(s, now)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What the twin needs of a request: its class, prompt tokens (the simulator's count:
    chat template, image placeholders), output tokens, and its unique multimodal items as
    (hash, prompt tokens of the sidecar's one-item encode request)."""

    long: bool
    prompt: int
    out: int
    items: tuple[tuple[str, int], ...] = ()


def shape(spec: RequestSpec) -> _Shape:
    """A completion's prompt is 4 bytes a token; a chat is parsed as the simulator does."""
    body = spec.body
    if "messages" not in body:
        return _Shape(spec.tag == "long", len(body["prompt"]) // 4, body["max_tokens"])
    parsed = parse_request(orjson.dumps(body), chat=True)
    items = tuple(
        (item.hash, max(1, count_tokens(parse_request(orjson.dumps(
            {"model": body.get("model", ""), "max_tokens": 1,
             "messages": [{"role": "user", "content": [item.block]}]}),
            chat=True).prompt)))
        for item in unique_items(mm_items(body["messages"])))
    return _Shape(spec.tag == "long", max(1, count_tokens(parsed.prompt)),
                  int(body.get("max_tokens") or 16), items)


def simulate(seed: int, prefill: int, decode: int, threshold: int | None, *,
             specs: Sequence[RequestSpec], link: str = "rdma",
             prefill_pick: str = "least", decode_pick: str = "least",
             spill: Spill | None = None,
             profile: Profile = H100_8B, encode: int = 0) -> list[Served]:
    """One run; ``threshold=None`` is the aggregated fleet of ``prefill + decode`` servers
    (always ``least``). With ``spill`` the decode server is picked at arrival, as the EPP
    does, and the :class:`Spill` decider may keep a long prompt there. ``specs``: the schedule
    (a request tagged ``long`` is of the long class). ``profile``: every server's (sim/profiles.py).
    ``encode``: encode servers in front (E/PD with ``threshold=None``, else E/P/D)."""
    fleet = _Fleet(seed, rng=random.Random(seed))
    bandwidth, latency = LINKS[link]
    if threshold is None:
        decoders = [_Server(Engine(profile, seed=i), i) for i in range(prefill + decode)]
        prefillers: list[_Server] = []
    else:
        decoders = [_Server(Engine(profile, seed=i), i) for i in range(decode)]
        prefillers = [_Server(Engine(profile, seed=100 + i), i) for i in range(prefill)]
    encoders = [_Server(Engine(profile, seed=200 + i), i) for i in range(encode)]
    served: list[Served] = []

    def answer(long: bool, arrival: float, disaggregated: bool = False) -> Then:
        def done(req: SimRequest, t: float) -> None:
            assert req.first_token_time is not None and req.finish_time is not None
            served.append(Served(long, req.first_token_time - arrival,
                                 (req.finish_time - req.first_token_time)
                                 / max(1, req.generated - 1), arrival, req.finish_time,
                                 req.generated, disaggregated, req.prompt_tokens))
        return done

    def arrive(shp: _Shape, arrival: float, now: float) -> None:
        if not (encoders and shp.items):
            return route(shp, arrival, now, loaded=False)
        # E/PD, E/P/D: each unique item to an encoder first (the sidecar, all at once); the
        # request goes on when the last is encoded.
        left = [len(shp.items)]

        def encoded(req: SimRequest, t: float) -> None:
            left[0] -= 1
            if left[0] == 0:
                fleet.push(t, lambda now: route(shp, arrival, now, loaded=True))
        for item, tokens in shp.items:
            fleet.submit(encoders, tokens, 1, now, now, encoded, items=(item,))

    def route(shp: _Shape, arrival: float, now: float, loaded: bool) -> None:
        prompt, out, items = shp.prompt, shp.out, tuple(h for h, _ in shp.items)
        target = None
        if spill is not None and threshold is not None:
            target = fleet.choose(decoders, decode_pick)
            local = prompt < threshold or spill.local(min(p.tokens for p in prefillers),
                                                      target.outstanding + target.reserved)
        else:
            local = threshold is None or prompt < threshold
        if local:
            fleet.submit(decoders, prompt, out, arrival, now, answer(shp.long, arrival),
                         pick="least" if threshold is None else decode_pick, on=target,
                         items=items, loaded=loaded)
            return
        if target is not None:
            target.reserved += 1

        def prefilled(req: SimRequest, t: float) -> None:   # its KV moves on to decode
            pull = latency + prompt * KV_BYTES_PER_TOKEN_8B / bandwidth  # B/s, s
            fleet.push(t + pull, lambda now: pulled(shp, arrival, target, now))
        fleet.submit(prefillers, prompt, 1, arrival, now, prefilled, pick=prefill_pick,
                     items=items, loaded=loaded)

    def pulled(shp: _Shape, arrival: float, target: _Server | None, now: float) -> None:
        """The KV has arrived at a decode server."""
        if target is not None:
            target.reserved -= 1
        fleet.submit(decoders, shp.prompt, shp.out, arrival, now, answer(shp.long, arrival, True),
                     remote=shp.prompt, pick=decode_pick, on=target)

    for s in decoders + prefillers + encoders:
        fleet.serve(s)
    for spec in specs:
        fleet.push(spec.at, functools.partial(arrive, shape(spec), spec.at))
    while fleet.events:
        now, _, run = heapq.heappop(fleet.events)
        run(now)
    return served


def parse_spill(text: str) -> Spill:
    """``TOKENS:REQUESTS`` (either side may be ``-``: not tested); ValueError otherwise."""
    try:
        tokens, requests = text.split(":")
        return Spill(None if tokens == "-" else int(tokens),
                     None if requests == "-" else int(requests))
    except ValueError:
        raise ValueError(
            f"expected PREFILL_TOKENS:DECODE_REQUESTS (e.g. 8000:1), got {text!r}") from None
