"""``precise-prefix-cache-scorer`` in process, over real ZMQ sockets: the endpoint-
notification source subscribes it to the pool's endpoints as they join and leave, and a
candidate without a working event stream is scored approximately while the others keep
their precise scores."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import httpx
import structlog

from devkit.manifests import pool_manifests
from devkit.net import free_port_run
from epp.datalayer import EndpointNotificationSource
from epp.datastore import Datastore
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.scheduling.plugins.prefix.precise_prefix_cache_scorer import (
    FALLBACKS,
    PrecisePrefixCacheParameters,
    PrecisePrefixCacheScorer,
)
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import ProfileResult, SchedulingResult
from shared.plugins import parse_parameters
from sim import start_fleet
from sim.kvevents import KVEventsConfig
from sim.tokenizer import token_ids
from tests.epp.kvcache.test_precise_prefix_envoy import OFFSET, free_run, manifests
from tests.support.sim import tiny

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def pool(base: int, ports: int) -> Datastore:
    import tempfile
    from pathlib import Path

    import yaml

    with tempfile.TemporaryDirectory() as d:
        manifests(Path(d) / "m.yaml", base)
        docs = list(yaml.safe_load_all((Path(d) / "m.yaml").read_text()))
    docs[0]["spec"]["targetPorts"] = docs[0]["spec"]["targetPorts"][:ports]
    ds = Datastore()
    ds.replace(build_snapshot([o for o in map(parse_object, docs) if o is not None],
                              pool_name="sims", pool_namespace="default"))
    return ds


async def until(cond: Callable[[], bool], what: str, timeout: float = 15) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_follows_the_pool_and_falls_back_only_where_the_stream_is_down() -> None:
    base = free_run()
    cfgs = [tiny(model=MODEL, port=base, kv_events=KVEventsConfig(
                enable_kv_cache_events=True, endpoint=f"tcp://*:{base + OFFSET}",
                topic="kv@{host}@{model}")),
            tiny(model=MODEL, port=base + 1)]  # publishes nothing: its stream stays down
    params = parse_parameters(PrecisePrefixCacheParameters, {
        "kvEventsConfig": {"podDiscoveryConfig": {"socketPortOffset": OFFSET}}}, label="t")
    scorer = PrecisePrefixCacheScorer("precise", params)
    source = EndpointNotificationSource("notify")
    source.add_extractor(scorer)
    ds = pool(base, 1)
    async with start_fleet(cfgs) as fleet, httpx.AsyncClient(timeout=10) as client:
        task = asyncio.create_task(source.run(ds))
        try:
            k0, k1 = f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"
            await until(lambda: scorer.live(k0), "subscribed to server 0")
            subs = scorer.subscriptions
            assert subs is not None and scorer.collector is None
            assert set(subs.subscribers) == {k0}

            # Server 1 joins the pool: a subscriber appears, but its stream never connects.
            ds.replace(pool(base, 2).snapshot)
            await until(lambda: k1 in subs.subscribers, "server 1 joined")
            assert not scorer.live(k1)

            prompt = "shared context for the precise scorer test. " * 12
            fill = 0
            while not scorer.index.endpoint_blocks().get(k0):  # past ZMQ's slow joiner
                r = await client.post(fleet.urls[0] + "/v1/completions", json={
                    "model": MODEL, "prompt": f"filler {fill} " * 30, "max_tokens": 1})
                assert r.status_code == 200
                fill += 1
                await asyncio.sleep(0.05)
            r = await client.post(fleet.urls[0] + "/v1/completions",
                                  json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
            assert r.status_code == 200
            ids = token_ids(prompt.encode())
            blocks = len(ids) // 16
            await until(lambda: scorer.index.score(ids, "").get(k0) == blocks, "indexed")

            views = ds.views()
            assert [v.endpoint.key for v in views] == [k0, k1]
            # The approximate side believes server 1 has the prompt (an earlier pick).
            scorer.approx.record(LLMRequest("old", MODEL, prompt_token_ids=ids), views[1])
            before = FALLBACKS.labels("no_stream")._value.get()
            req = LLMRequest("r", MODEL, prompt_token_ids=ids)
            assert list(scorer.score(req, views)) == [1.0, 1.0]  # precise, approximate
            assert FALLBACKS.labels("no_stream")._value.get() == before + 1
            # Only server 0 in the candidates: fully precise, nothing counted.
            assert list(scorer.score(LLMRequest("r2", MODEL, prompt_token_ids=ids),
                                     views[:1])) == [1.0]
            assert FALLBACKS.labels("no_stream")._value.get() == before + 1

            # Server 1 leaves: its subscriber goes; server 0's index entries stay.
            ds.replace(pool(base, 1).snapshot)
            await until(lambda: k1 not in subs.subscribers, "server 1 left")
            assert scorer.index.endpoint_blocks().get(k0)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert subs.subscribers == {}  # the source closed its extractors


async def test_speculative_indexing_counts_a_pick_until_the_events_can_confirm_it() -> None:
    base = free_run()
    cfg = tiny(model=MODEL, port=base, kv_events=KVEventsConfig(
        enable_kv_cache_events=True, endpoint=f"tcp://*:{base + OFFSET}",
        topic="kv@{host}@{model}"))
    scorers = {}
    for on in (True, False):
        params = parse_parameters(PrecisePrefixCacheParameters, {
            "speculativeIndexing": on, "speculativeTTL": "1m",
            "kvEventsConfig": {"podDiscoveryConfig": {"socketPortOffset": OFFSET}}}, label="t")
        scorers[on] = PrecisePrefixCacheScorer(f"precise-{on}", params)
    ds = pool(base, 1)
    async with start_fleet([cfg]):
        for sc in scorers.values():
            await sc.endpoints_changed(ds.views())
        try:
            key = f"127.0.0.1:{base}"
            await until(lambda: all(sc.live(key) for sc in scorers.values()), "subscribed")
            ids = token_ids(("never sent to any server. " * 10).encode())
            views = ds.views()
            for on, sc in scorers.items():
                first = LLMRequest("a", MODEL, prompt_token_ids=ids)
                assert list(sc.score(first, views)) == [0.0]
                sc.pre_request(first, SchedulingResult(
                    {"default": ProfileResult("default", [views[0]])}, "default"))
                again = LLMRequest("b", MODEL, prompt_token_ids=ids)
                # Nothing was sent, so no event: only the speculative entry can say so.
                assert list(sc.score(again, views)) == ([1.0] if on else [0.0])
        finally:
            for sc in scorers.values():
                await sc.close()


async def test_a_restarted_server_is_not_scored_warm_from_its_past_life() -> None:
    """A lost stream (the server died) makes the endpoint cold for every guess the scorer
    keeps: while its stream is down the endpoint is scored approximately, and the approximate
    side must not remember picks made before the restart, nor speculative entries."""
    base = free_run()
    cfg = tiny(model=MODEL, port=base, kv_events=KVEventsConfig(
        enable_kv_cache_events=True, endpoint=f"tcp://*:{base + OFFSET}",
        topic="kv@{host}@{model}"))
    params = parse_parameters(PrecisePrefixCacheParameters, {
        "speculativeIndexing": True, "speculativeTTL": "1m",
        "kvEventsConfig": {"podDiscoveryConfig": {"socketPortOffset": OFFSET}}}, label="t")
    scorer = PrecisePrefixCacheScorer("precise-restart", params)
    ds = pool(base, 1)
    async with start_fleet([cfg]) as fleet:
        await scorer.endpoints_changed(ds.views())
        try:
            key = f"127.0.0.1:{base}"
            await until(lambda: scorer.live(key), "subscribed")
            ids = token_ids(("a prompt picked before the restart. " * 10).encode())
            views = ds.views()
            first = LLMRequest("a", MODEL, prompt_token_ids=ids)
            scorer.score(first, views)
            scorer.pre_request(first, SchedulingResult(
                {"default": ProfileResult("default", [views[0]])}, "default"))
            assert list(scorer.score(LLMRequest("b", MODEL, prompt_token_ids=ids),
                                     views)) == [1.0]  # the speculative entry

            await fleet.kill(base)
            await until(lambda: not scorer.live(key), "stream lost")
            # Down: scored approximately, and the approximate side forgot the old pick.
            assert list(scorer.score(LLMRequest("c", MODEL, prompt_token_ids=ids),
                                     views)) == [0.0]
            await fleet.revive(base)
            await until(lambda: scorer.live(key), "stream back")
            assert list(scorer.score(LLMRequest("d", MODEL, prompt_token_ids=ids),
                                     views)) == [0.0]
        finally:
            await scorer.close()


def ip_pool(ips: list[str], port: int) -> Datastore:
    """A pool of one pod per IP, all serving on ``port``."""
    docs = pool_manifests("sims", [(f"sims-{i}", ip) for i, ip in enumerate(ips)], port)
    ds = Datastore()
    ds.replace(build_snapshot([o for o in map(parse_object, docs) if o is not None],
                              pool_name="sims", pool_namespace="default"))
    return ds


async def test_zmq_endpoint_mode_scores_what_the_bound_socket_hears() -> None:
    """llm-d's centralized mode in the scorer: servers on 127.0.0.8/.9 connect to the socket
    the scorer binds; an endpoint counts as live once heard; a restart makes its cache cold
    for every guess; one leaving the pool is forgotten; metricsLoggingInterval logs."""
    base = free_port_run(3)  # HTTP, replay, the bound socket
    ips = ["127.0.0.8", "127.0.0.9"]
    cfgs = [tiny(model=MODEL, host=ip, port=base, time_scale=0.05, kv_events=KVEventsConfig(
                enable_kv_cache_events=True, endpoint=f"tcp://127.0.0.1:{base + 2}",
                replay_endpoint=f"tcp://{ip}:{base + 1}", topic="kv@{host}@{model}"))
            for ip in ips]
    params = parse_parameters(PrecisePrefixCacheParameters, {
        "kvEventsConfig": {"zmqEndpoint": f"tcp://127.0.0.1:{base + 2}",
                           "podDiscoveryConfig": {"replaySocketPort": base + 1}},
        "indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": True,
                                                 "metricsLoggingInterval": "50ms"}}},
        label="t")
    scorer = PrecisePrefixCacheScorer("central", params)
    scorer.open()
    collector = scorer.collector
    assert collector is not None and scorer.subscriptions is None
    source = EndpointNotificationSource("notify")
    source.add_extractor(scorer)
    ds = ip_pool(ips, base)
    k0, k1 = (f"{ip}:{base}" for ip in ips)
    async with start_fleet(cfgs) as fleet, httpx.AsyncClient(timeout=10) as client:

        async def until_heard(i: int, what: Callable[[], bool]) -> None:
            for n in range(300):
                if what():
                    return
                r = await client.post(fleet.urls[i] + "/v1/completions", json={
                    "model": MODEL, "prompt": f"filler {i} {n} " * 30, "max_tokens": 1})
                assert r.status_code == 200
                await asyncio.sleep(0.02)
            raise AssertionError("never heard")

        with structlog.testing.capture_logs() as logs:
            task = asyncio.create_task(source.run(ds))
            try:
                await until(lambda: set(collector.sources) == {k0, k1}, "pool synced")
                assert not scorer.live(k0) and not scorer.live(k1)  # nothing heard yet
                await until_heard(0, lambda: scorer.live(k0))
                assert collector.streams[k0].source.replay_address == \
                    f"tcp://{ips[0]}:{base + 1}"
                assert not scorer.live(k1)

                prompt = "shared context for the central scorer test. " * 12
                ids = token_ids(prompt.encode())
                r = await client.post(fleet.urls[0] + "/v1/completions",
                                      json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
                assert r.status_code == 200
                await until(lambda: scorer.index.score(ids, "").get(k0) == len(ids) // 16,
                            "indexed")
                views = ds.views()
                assert [v.endpoint.key for v in views] == [k0, k1]
                req = LLMRequest("r", MODEL, prompt_token_ids=ids)
                assert list(scorer.score(req, views)) == [1.0, 0.0]  # precise, approximate

                # The approximate side remembers a pick of server 0; it restarts.
                scorer.approx.record(LLMRequest("old", MODEL, prompt_token_ids=ids), views[0])
                assert k0 in scorer.approx.match(LLMRequest("q", MODEL,
                                                            prompt_token_ids=ids)).matched
                await fleet.servers[0].kill()
                await fleet.servers[0].revive()
                await until_heard(0, lambda: collector.streams[k0].batches > 0
                                  and scorer.index.score(ids, "").get(k0) is None)
                assert k0 not in scorer.approx.match(LLMRequest("q2", MODEL,
                                                                prompt_token_ids=ids)).matched

                # Server 1 is heard, then leaves the pool: forgotten.
                await until_heard(1, lambda: bool(scorer.index.endpoint_blocks().get(k1)))
                ds.replace(ip_pool(ips[:1], base).snapshot)
                await until(lambda: k1 not in collector.streams, "server 1 left")
                assert k1 not in scorer.index.endpoint_blocks()
                await until(lambda: any(e["event"] == "kv index" for e in logs), "index logged")
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    assert collector._sock is None  # the source closed its extractors
    line = next(e for e in logs if e["event"] == "kv index")
    assert line["endpoints"] >= 1 and line["keys"] >= 1
