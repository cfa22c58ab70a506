"""The SLO / session-affinity benchmarks on a virtual clock: the real EPP runtime (director,
scheduler, every plugin, the latency model) in front of a fleet of the simulator's engines
(:class:`sim.engine.Engine`) that run in virtual time, scraped every 50 ms. Nothing sleeps,
so one run of thousands of requests takes seconds and every seed is reproducible.

Run: ``python -m bench.slo_twin`` (prediction error and multi-turn, 5 seeds; a few minutes) or
``python -m bench.slo_twin --seeds 2 --quick``. Results: stdout and the "## SLO and session
affinity" section of ``bench/RESULTS.md``.

1. prediction error (MAPE of the picked endpoint's predicted TTFT/TPOT vs measured, after
   warm-up: the first 30% of requests) on the ShareGPT-like and shared-prefix workloads;
2. mixed SLO: now the ``slo-routing`` scenario (``python -m bench run slo-routing``); the
   mixed-SLO rows in ``bench/RESULTS.md`` were this script's ``--only slo`` (removed);
3. multi-turn conversations (each turn re-sends the history): TTFT p90 with the default
   load scorers alone, with the approximate prefix scorer (the default profile), and with
   ``session-affinity-scorer``;
4. pick latency at 100 endpoints while the model retrains in a background thread
   (``python -m bench.micro slo-pick``).

Time the EPP would add on the wire is not modelled (the twin measures scheduling quality).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.stats import bootstrap_median
from bench.twin.vtime import RESOLUTION, run_in_virtual_time
from bench.workloads import (
    RequestSpec,
    _completion,
    _words,
    objective_manifests,
    poisson_arrivals,
)
from devkit.manifests import pool_manifests
from epp.config import build, parse_config
from epp.datastore import Datastore, EndpointMetrics
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.latency.predictions import predictions_of
from epp.latency.predictor import fit_linear
from epp.requestcontrol import Director, Routed
from epp.requestcontrol.plugins.predicted_latency_producer import (
    PredictedLatencyProducer,
    predicted_tpot,
)
from shared.errors import GatewayError
from sim.engine import Engine, SimRequest
from sim.profiles import H100_8B, Profile

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

# The two workloads, as the results in RESULTS.md were measured (4 servers of 8b-h100;
# bench/workloads' YAML versions are sized for the 8-server comparison).
_ITL, _OVERHEAD, _PER_TOKEN = 0.012, 0.030, 0.00025
SP_SYSTEM, SP_QUESTION, SP_OUTPUT, SP_PER_GROUP = 6000, 1200, 100, 5
SG_IN_MEDIAN, SG_IN_SIGMA, SG_OUT_MEDIAN, SG_OUT_SIGMA = 800, 0.7, 80, 0.6


def _prefill(tokens: float) -> float:
    return _OVERHEAD + _ITL + tokens * _PER_TOKEN


SP_CAPACITY = 4 / _prefill(SP_QUESTION + SP_SYSTEM / SP_PER_GROUP)
SG_CAPACITY = 4 / _prefill(SG_IN_MEDIAN * math.exp(SG_IN_SIGMA ** 2 / 2))


def shared_prefix(rng: random.Random, rate: float, duration: float) -> list[RequestSpec]:
    """Groups of 5 prompts: a 6,000-token group system prompt + a unique 1,200-token
    question, 100 output tokens, shuffled, Poisson arrivals."""
    n = max(SP_PER_GROUP, round(rate * duration))
    groups = math.ceil(n / SP_PER_GROUP)
    systems = [_words(rng, SP_SYSTEM) for _ in range(groups)]
    order = [g for g in range(groups) for _ in range(SP_PER_GROUP)]
    rng.shuffle(order)
    times = poisson_arrivals(rng, rate, n)
    return [RequestSpec(t, "/v1/completions",
                        _completion(systems[g] + _words(rng, SP_QUESTION), SP_OUTPUT),
                        tag=f"group-{g}")
            for t, g in zip(times, order[:n], strict=True)]


def sharegpt_like(rng: random.Random, rate: float, duration: float) -> list[RequestSpec]:
    """Unique prompts, lognormal input (median 800, sigma 0.7, 16..4000 tokens) and output
    (median 80, sigma 0.6, 4..400) lengths, Poisson arrivals."""
    n = max(1, round(rate * duration))
    specs = []
    for t in poisson_arrivals(rng, rate, n):
        prompt = int(min(4000, max(16, rng.lognormvariate(math.log(SG_IN_MEDIAN),
                                                          SG_IN_SIGMA))))
        out = int(min(400, max(4, rng.lognormvariate(math.log(SG_OUT_MEDIAN), SG_OUT_SIGMA))))
        specs.append(RequestSpec(t, "/v1/completions", _completion(_words(rng, prompt), out)))
    return specs
FLEET = 4
SCRAPE = 0.05
RETRAIN = 1.0
WARMUP = 0.3

DEFAULT = None  # parse_config(None): queue x2, kv x2, prefix x3, max-score picker
LATENCY = """\
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- {name: strict-affinity-filter, type: prefix-cache-affinity-filter,
   parameters: {affinityThreshold: 0.99}}
- {name: loose-affinity-filter, type: prefix-cache-affinity-filter,
   parameters: {affinityThreshold: 0.80}}
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
"""
# Prediction only: the default profile schedules, the producer predicts and learns.
PREDICT_ONLY = """\
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
"""
LOAD_ONLY = """\
plugins: [{type: queue-scorer}, {type: kv-cache-utilization-scorer}]
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
"""
SESSION = """\
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: session-affinity-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: session-affinity-scorer, weight: 3}
"""


@dataclass(slots=True)
class Done:
    """One request's outcome."""

    tag: str
    ttft: float
    tpot: float | None
    out_tokens: int
    slo_ttft: float | None
    predicted_ttft: float | None
    predicted_tpot: float | None
    finish: float
    session_token: str | None = None
    #: The engine that served it and when its first token came (model seconds).
    engine: int = -1
    first_token_at: float = 0.0
    #: When it arrived (and, without flow control, was picked).
    arrival: float = 0.0
    #: The predicted TPOT the producer reports (the pick's and the in-stream ones' mean).
    reported_tpot: float | None = None
    #: The producer's quantile (p90) predictions for the picked endpoint, and the TPOT SLO.
    predicted_ttft_q: float | None = None
    predicted_tpot_q: float | None = None
    slo_tpot: float | None = None


@dataclass(order=True, slots=True)
class Arrival:
    at: float
    seq: int
    body: dict[str, Any] = field(compare=False)
    headers: dict[str, str] = field(compare=False)
    tag: str = field(compare=False, default="")
    #: Called with the outcome (multi-turn: schedules the next turn).
    then: Callable[[Done], None] | None = field(compare=False, default=None)


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
        #: Per engine: (time, tokens computed) of each prefill that ended there.
        self.prefilled: list[list[tuple[float, int]]] = [[] for _ in range(fleet)]
        for i, e in enumerate(self.engines):
            e.on_event = self._event(i)

    def add(self, at: float, body: dict[str, Any], headers: dict[str, str] | None = None,
            tag: str = "", then: Callable[[Done], None] | None = None) -> None:
        self._seq += 1
        heapq.heappush(self.pending, Arrival(at, self._seq, body, headers or {}, tag, then))

    def _event(self, i: int) -> Callable[[str, SimRequest, float], None]:
        def on(kind: str, req: SimRequest, t: float) -> None:
            entry = self.inflight.get(req.id)
            if entry is None:
                return
            routed, arrival, _ = entry
            if kind in ("first_token", "token"):  # one streamed chunk per token
                if kind == "first_token":
                    self.prefilled[i].append((t, req.prompt_tokens - req.cached_tokens))
                    routed.response.ttft = t - arrival.at
                for plugin in self.runtime.response_streaming:
                    plugin.response_streaming(routed.request, routed.response, b"",
                                              routed.endpoint)
            elif kind == "finish":
                del self.inflight[req.id]
                self._finish(routed, arrival, req, t)
        return on

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
        slo = arrival.headers.get("x-slo-ttft-ms")
        slo_tpot = arrival.headers.get("x-slo-tpot-ms")
        done = Done(arrival.tag, ttft, r.tpot, req.generated,
                    float(slo) / 1000 if slo else None,
                    p.ttft if p else None, p.tpot if p else None, t,
                    r.set_headers.get("x-session-token"), self.by_key[routed.endpoint.key],
                    arrival.at + ttft, arrival.at,
                    predicted_tpot(preds) if preds is not None else None,
                    p.ttft_q if p else None, p.tpot_q if p else None,
                    float(slo_tpot) / 1000 if slo_tpot else None)
        self.done.append(done)
        if arrival.then is not None:
            arrival.then(done)

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


# -- statistics ---------------------------------------------------------------------------------


def median_ci(values: list[float]) -> tuple[float, float, float]:
    """Median and the 95% percentile-bootstrap interval of the median over ``values``
    (seeds), by :func:`bench.stats.bootstrap_median`."""
    iv = bootstrap_median(values)
    return iv.median, iv.lo, iv.hi


def fmt(values: list[float], digits: int = 3) -> str:
    m, lo, hi = median_ci(values)
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else math.nan


def mape(pairs: list[tuple[float, float]]) -> float:
    return 100 * statistics.fmean(abs(p - a) / a for p, a in pairs) if pairs else math.nan


# -- 1. prediction error ------------------------------------------------------------------------


def best_constant_mape(actual: list[float]) -> float:
    """MAPE of the best single value for every request (the 1/y-weighted median): what a
    predictor that ignores every feature achieves, the bar a model has to clear."""
    ys = sorted(actual)
    half, acc = sum(1 / y for y in ys) / 2, 0.0
    for y in ys:
        acc += 1 / y
        if acc >= half:
            return mape([(y, a) for a in ys])
    return math.nan


def post_pick_tpot_mape(twin: Twin, train: list[Done], test: list[Done]) -> float:
    """TPOT MAPE of a model that knows what no pick-time predictor can: the prompt tokens
    other requests prefilled on the request's engine between its first and last token, per
    decode token (fitted on ``train``, judged on ``test``). Near zero means TPOT is set by
    what arrives after the pick."""
    def feature(d: Done) -> tuple[float]:
        tokens = sum(n for t, n in twin.prefilled[d.engine] if d.first_token_at < t <= d.finish)
        return (tokens / (d.out_tokens - 1),)
    pairs = [(feature(d), d.tpot) for d in train if d.tpot is not None]
    model = fit_linear([x for x, _ in pairs], [y for _, y in pairs])
    return mape([(model(feature(d)), d.tpot) for d in test if d.tpot is not None])


def prediction_error(workload: str, seed: int, duration: float, config: str = PREDICT_ONLY,
                     ) -> tuple[float, float, float, float, float, float, float]:
    """MAPE (%) of TTFT and TPOT after warm-up, the best constant's TPOT MAPE,
    :func:`post_pick_tpot_mape`, TTFT and TPOT MAPE after the model's own warm-up, and the
    MAPE of the predicted TPOT the producer reports (with in-stream samples when ``config``
    asks for them: :func:`sampled_config`).

    Warm-up, as before: the first ``WARMUP`` of the completed requests. The model's own
    warm-up: the first ``WARMUP`` of the requests it predicted, by pick time. They differ when
    nothing completes for a while: in shared-prefix's cold start (every group's first prompt
    a miss, the fleet working off a prefill backlog) the first 30% of completions end in one
    burst as the backlog drains, and the requests picked right then are predicted by the
    first model, fitted only on the backlog."""
    rng = random.Random(seed)
    if workload == "sharegpt":
        specs = sharegpt_like(rng, 0.7 * SG_CAPACITY, duration)
    else:
        specs = shared_prefix(rng, 0.7 * SP_CAPACITY, duration)
    twin = Twin(config, seed)
    for s in specs:
        twin.add(s.at, s.body)
    twin.run()
    ordered = sorted(twin.done, key=lambda d: d.finish)
    warm, done = ordered[:int(WARMUP * len(ordered))], ordered[int(WARMUP * len(ordered)):]
    ttft, tpot = _predicted_pairs(done)
    predicted = sorted((d for d in twin.done if d.predicted_ttft is not None),
                       key=lambda d: d.arrival)
    model_ttft, model_tpot = _predicted_pairs(predicted[int(WARMUP * len(predicted)):])
    return (mape(ttft), mape(tpot), best_constant_mape([a for _, a in tpot]),
            post_pick_tpot_mape(twin, warm, [d for d in done if d.predicted_tpot is not None]),
            mape(model_ttft), mape(model_tpot),
            mape([(p, a) for d in done
                  if (p := d.reported_tpot) is not None and (a := d.tpot) is not None]))


def sampled_config(samples: int, mean: float) -> str:
    """:data:`PREDICT_ONLY` with upstream's in-stream TPOT predictions: up to ``samples``
    tokens, Poisson-spaced with mean ``mean``."""
    return PREDICT_ONLY.replace("{streamingMode: true}", (
        f"{{streamingMode: true, maxDecodeTokenSamplesForPrediction: {samples}, "
        f"samplingMean: {mean}}}"))


def _predicted_pairs(done: list[Done]) -> tuple[list[tuple[float, float]],
                                                list[tuple[float, float]]]:
    """(predicted, actual) TTFT pairs and TPOT pairs of the requests that have them."""
    ttft = [(p, d.ttft) for d in done if (p := d.predicted_ttft) is not None]
    tpot = [(p, a) for d in done
            if (p := d.predicted_tpot) is not None and (a := d.tpot) is not None]
    return ttft, tpot


# -- 3. multi-turn ------------------------------------------------------------------------------


def multi_turn(config: str | None, seed: int, conversations: int, turns: int) -> float:
    rng = random.Random(seed)
    twin = Twin(config, seed)
    ttfts: list[float] = []

    def turn(conv: int, k: int, history: str, token: str | None, at: float) -> None:
        prompt = history + _words(rng, 150)
        headers = {"x-session-token": token} if token else {}

        def then(d: Done) -> None:
            if k > 0:  # the first turn has nothing cached anywhere: not counted
                ttfts.append(d.ttft)
            if k + 1 < turns:
                answer = _words(rng, 60)
                turn(conv, k + 1, prompt + answer, d.session_token or token,
                     d.finish + rng.expovariate(1 / 2.0))
        twin.add(at, {"model": "m", "prompt": prompt, "max_tokens": 60}, headers,
                 f"conv-{conv}", then)

    for c in range(conversations):
        turn(c, 0, _words(rng, 1000), None, rng.uniform(0, 20.0))
    twin.run()
    return pct(ttfts, 0.9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("mape", "multiturn"), default=None)
    ap.add_argument("--write", action="store_true", help="print the RESULTS.md section")
    ap.add_argument("--tpot-samples", type=int, default=0, metavar="N",
                    help="mape: the producer's maxDecodeTokenSamplesForPrediction (default 0)")
    ap.add_argument("--sampling-mean", type=float, default=1000.0, metavar="M",
                    help="mape: the producer's samplingMean (default 1000, upstream's)")
    args = ap.parse_args()
    seeds = range(1, args.seeds + 1)
    dur = 60.0 if args.quick else 120.0
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    if args.only in (None, "mape"):
        for wl in ("sharegpt", "shared-prefix"):
            res = [prediction_error(wl, s, dur, sampled_config(args.tpot_samples,
                                                                 args.sampling_mean))
                   for s in seeds]
            say(f"| MAPE {wl} | TTFT {fmt([r[0] for r in res], 1)} % | "
                f"TPOT {fmt([r[1] for r in res], 1)} % (best constant "
                f"{fmt([r[2] for r in res], 1)} %; knowing the prefills that reached the "
                f"engine after the pick: {fmt([r[3] for r in res], 1)} %) | after the model's "
                f"own warm-up: TTFT {fmt([r[4] for r in res], 1)} %, TPOT "
                f"{fmt([r[5] for r in res], 1)} % | reported TPOT (in-stream samples "
                f"{args.tpot_samples}, mean {args.sampling_mean:g}): "
                f"{fmt([r[6] for r in res], 1)} % |")
    if args.only in (None, "multiturn"):
        conv, turns = (40, 5) if args.quick else (80, 6)
        turn_p90 = {name: [multi_turn(cfg, s, conv, turns) for s in seeds]
                    for name, cfg in (("load only", LOAD_ONLY), ("approx prefix", DEFAULT),
                                      ("session affinity", SESSION))}
        say("| multi-turn TTFT p90 (s) | " + " | ".join(
            f"{k}: {fmt(v)}" for k, v in turn_p90.items()) + " |")
        sess = turn_p90["session affinity"]
        vs_load = [a / b for a, b in zip(sess, turn_p90["load only"], strict=True)]
        vs_prefix = [a / b for a, b in zip(sess, turn_p90["approx prefix"], strict=True)]
        say(f"| ratios (per seed) | session / load only {fmt(vs_load)} | "
            f"session / approx prefix {fmt(vs_prefix)} |")

if __name__ == "__main__":
    main()
