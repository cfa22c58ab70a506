"""The ONLY place the twin touches the EPP: the real service objects, wired as ``epp.main``
wires them, driven by the twin's loop instead of gRPC and HTTP scrapes.

What is real here: the EndpointPickerConfig loader (``--config-file`` / the default config),
:func:`epp.config.build` (the same plugin objects, profiles, producers, detectors and
response hooks the service runs), the :class:`~epp.datastore.Datastore` fed from InferencePool
+ Pod manifests by the manifests source's loader, and :class:`~epp.requestcontrol.Director`
from ``Director.of(runtime)`` - ``route()`` with the client's body and headers for each
request (``prepare`` / ``admit`` / ``dispatch`` on the twin's virtual-time event loop when an
admitter may wait: flow control, a burst producer's windows), the response hooks at each
streamed token's and the response end's virtual time. The runtime gets a seeded RNG, so one
seed picks the same endpoints every time; a ``predicted-latency-producer``'s model is retrained
every model second in this thread (:data:`RETRAIN`). The config's data sources are built but
not run: the twin's loop delivers the scrapes.

What replaces the network: a scrape's reading (:class:`bench.twin.loop.ServerState`) becomes
the :class:`~epp.datastore.EndpointMetrics` the ``core-metrics-extractor`` would produce from
the simulator's /metrics (waiting, running, KV usage, LoRA info, served model), installed with
``begin_scrape`` / ``record_scrape`` at the virtual times the loop chooses.

When the EPP's director or config API changes, this file is what to adapt.
"""

from __future__ import annotations

import asyncio
import math
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from bench.twin.cpu import ProcessCpu
from bench.twin.loop import Refused, ServerState
from bench.workloads import objective_manifests
from devkit.manifests import pool_manifests
from epp.config import ConfigError, build, load_config_file, parse_config
from epp.datastore import Datastore, EndpointMetrics, EndpointView
from epp.datastore.endpoint_state import LoraInfo
from epp.handle import Settings
from epp.latency.predictions import predictions_of
from epp.requestcontrol import Director
from epp.requestcontrol.director import DESTINATION, Routed
from epp.requestcontrol.plugins.predicted_latency_producer import (
    PredictedLatencyProducer,
    predicted_tpot,
)
from epp.scheduling.plugins.prefix.precise_prefix_cache_scorer import (
    BASE_MODEL_KEY,
    PrecisePrefixCacheScorer,
)
from epp.sources.manifests import load_snapshot
from epp.statestore import StateStore
from shared.errors import GatewayError

#: ``--refresh-metrics-interval`` and ``--metrics-staleness-threshold`` defaults of epp.main.
SCRAPE_INTERVAL = 0.05
STALENESS = 2.0
POOL = "twin"
#: Model seconds between retrainings of a latency model (the service retrains in the
#: background; here in the loop's thread, so a seed is one run).
RETRAIN = 1.0
#: The response headers of the simulator's streamed completions.
SSE = {"content-type": "text/event-stream"}


def _manifests(keys: list[str], labels: Mapping[str, Mapping[str, str]] | None = None,
               ) -> list[dict[str, object]]:
    """An InferencePool, one ready Pod per server and the benchmark's InferenceObjectives
    (as ``bench.contenders`` writes them); ``labels``: more pod labels by endpoint key."""
    port = int(keys[0].rsplit(":", 1)[1])
    pods = [(f"sim-{i}", key.rsplit(":", 1)[0]) for i, key in enumerate(keys)]
    docs = pool_manifests(POOL, pods, port, objective_manifests(POOL))
    for key, extra in (labels or {}).items():
        doc = docs[1 + keys.index(key)]
        doc["metadata"]["labels"].update(extra)
    return docs


class EppRouter:
    """The EPP as a twin router (see the module docstring)."""

    scrape_interval: float | None = SCRAPE_INTERVAL

    def __init__(self, name: str, keys: list[str], seed: int, *, config_text: str | None = None,
                 config_file: Path | None = None, model: str = "",
                 state_store: StateStore | None = None, cpu: ProcessCpu | None = None,
                 labels: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """``config_file`` or ``config_text`` (neither: the EPP's default config); raises
        :class:`ConfigError` for a bad config, naming the file. ``state_store``: what the
        handle shares (:mod:`bench.twin.replicas`; a private in-memory store when None).
        ``cpu``: the process's CPU model (None: picks and chunks cost no time).
        ``labels``: more pod labels by endpoint key (e.g. context-length ranges)."""
        self.name = name
        self.cpu = cpu
        self.model = model
        config = (load_config_file(config_file) if config_file is not None
                  else parse_config(config_text, source=name))
        rng = random.Random(f"{name}:{seed}")
        self.datastore = Datastore()
        runtime = build(config, self.datastore, Settings(staleness=STALENESS),
                        rng=random.Random(rng.random()), state_store=state_store)
        self.datastore.subscribe(lambda s: runtime.retain_endpoints(
            frozenset(e.key for e in s.endpoints)))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "pool.yaml"
            path.write_text(yaml.safe_dump_all(_manifests(keys, labels), sort_keys=False))
            self.datastore.replace(load_snapshot(path, pool_name=POOL, pool_namespace="default"))
        self.director = Director.of(runtime)
        self.runtime = runtime
        self.views: dict[str, EndpointView] = {v.key: v for v in self.datastore.views()}
        #: per request in flight: what the director routed, and when (model seconds)
        self._routed: dict[int, tuple[Routed, float]] = {}
        self.producers = runtime.handle.find(PredictedLatencyProducer)
        for p in self.producers:
            p.predictor.stop()  # retrained on the virtual clock instead (deterministic),
            p.predictor.executor = None  # in this thread
        if self.producers:
            self.retrain, self.retrain_interval = self._retrain, RETRAIN
        if runtime.admitters:  # they may wait: the loop plays this router on an event loop
            self.route_async = self._route_async
        if cpu is not None:  # a pick waits for the process (read by the twin's loop)
            self.pick_done = cpu.pick_done
        #: the precise prefix scorers' indexes, fed the engines' KV events by the loop
        #: (:attr:`kv_events`; None without such a scorer)
        precise = runtime.handle.find(PrecisePrefixCacheScorer)
        for scorer in precise:  # no sockets here: every server's events arrive, in-process
            scorer.live = lambda key: True  # type: ignore[method-assign]
        self.indexes = [p.index for p in precise]
        self.kv_events = self._index_events if self.indexes else None

    def _index_events(self, key: str, events: list[Any]) -> None:
        """One engine step's KV events of server ``key``, as a subscriber applies them."""
        for index in self.indexes:
            for event in events:
                index.apply(key, event, BASE_MODEL_KEY)

    def _headers(self, index: int, path: str, headers: Mapping[str, str]) -> dict[str, str]:
        return {**headers, ":path": path, ":method": "POST",
                "content-type": "application/json", "x-request-id": f"twin-{index}"}

    def route(self, index: int, path: str, body: bytes, now: float,
              headers: Mapping[str, str]) -> str:
        """``Director.route`` with the client's request, as the ext_proc exchange calls it."""
        try:
            decision, routed = self.director.route(self._headers(index, path, headers),
                                                   body, {})
        except GatewayError as e:
            raise Refused(e.status, str(e)) from None
        self._sent(index, routed, now)
        return decision.set_headers[DESTINATION]

    async def _route_async(self, index: int, path: str, body: bytes,
                           headers: Mapping[str, str]) -> str:
        """prepare, admit (its admitters may hold the request on the loop's clock),
        dispatch: what the ext_proc exchange does when an admitter may wait."""
        director = self.director
        try:
            pending = director.prepare(self._headers(index, path, headers), body, {})
            await director.admit(pending)
            decision, routed = director.dispatch(pending)
        except GatewayError as e:
            raise Refused(e.status, str(e)) from None
        self._sent(index, routed, asyncio.get_running_loop().time())
        return decision.set_headers[DESTINATION]

    def _sent(self, index: int, routed: Routed, now: float) -> None:
        """The response side opens (the simulator streams at once)."""
        self._routed[index] = (routed, now)
        self.director.response_received(routed, 200, SSE)

    def token(self, index: int, now: float, first: bool) -> float:
        """A streamed token of request ``index`` reaches the EPP at ``now``; returns when
        the process has passed it on (its CPU model's queue; ``now`` without one)."""
        if self.cpu is not None:
            now = self.cpu.run(now, self.cpu.per_token)
        routed, started = self._routed[index]
        response = routed.response
        if first:
            self.director.first_token(routed, now - started)
        for plugin in self.runtime.response_streaming:
            plugin.response_streaming(routed.request, response, b"", routed.endpoint)
        return now

    def done(self, index: int, prompt_tokens: int, completion_tokens: int,
             now: float) -> tuple[float | None, ...] | None:
        """``Director.finish`` at the response's end, in model seconds; the predictions
        the request carried for its endpoint (None: no latency producer)."""
        routed, started = self._routed.pop(index)
        r = routed.response
        r.completed, r.status, r.size = True, 200 if completion_tokens else 429, 0
        r.prompt_tokens, r.completion_tokens = prompt_tokens, completion_tokens
        r.elapsed = now - started
        if completion_tokens > 1 and r.ttft is not None:
            r.tpot = (r.elapsed - r.ttft) / (completion_tokens - 1)
        elif completion_tokens:
            r.tpot = r.elapsed / completion_tokens
        for plugin in self.runtime.response_complete:
            plugin.response_complete(routed.request, r, routed.endpoint)
        preds = predictions_of(routed.request)
        p = preds.by_endpoint.get(routed.endpoint.key) if preds is not None else None
        if preds is None or p is None:
            return None
        return p.ttft, p.tpot, p.ttft_q, p.tpot_q, predicted_tpot(preds)

    def _retrain(self) -> None:
        for p in self.producers:
            p.predictor.retrain()

    async def aclose(self) -> None:
        """The flow controller's dispatcher task ends with the run."""
        if self.runtime.flow_control is not None:
            await self.runtime.flow_control.aclose()

    def begin_scrape(self, key: str) -> None:
        self.views[key].begin_scrape()

    def scraped(self, key: str, state: ServerState) -> None:
        # The director's staleness filter and the saturation detector (200 ms) compare
        # ``updated_at`` with the wall clock's monotonic time. A twin scrape is as fresh as
        # the loop says and never fails, so it stays fresh until the next one replaces it: a
        # wall-clock stamp let a slow run on a loaded machine look stale (priority-flood's
        # epp-tuned, seed 2: TTFT p90 3.86-4.10 s over four runs of the same code).
        metrics = EndpointMetrics(
            waiting=state.waiting, running=state.running, kv_usage=state.kv_usage,
            lora=LoraInfo(state.max_lora, state.running_adapters, state.waiting_adapters),
            block_size=state.block_size, num_gpu_blocks=state.num_gpu_blocks,
            models=frozenset({self.model}) if self.model else frozenset(),
            updated_at=math.inf)
        self.datastore.record_scrape(self.views[key], metrics)
        # The director keeps the served models for SERVED_TTL wall seconds; a twin run can
        # be shorter, so a cache filled before the first scrape (the base model unknown,
        # every request taken for an adapter) would hold: read them afresh after a scrape.
        self.director._served_until = 0.0


__all__ = ["SCRAPE_INTERVAL", "ConfigError", "EppRouter"]
