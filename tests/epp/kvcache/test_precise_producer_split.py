"""llm-d v0.10's producer/scorer split: ``precise-prefix-cache-producer`` subscribed to a
real simulator's KV events (over ZMQ), read by the generic ``prefix-cache-scorer`` named to
it by ``prefixMatchInfoProducerName``, built from a config as the EPP builds it."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from epp.config import build, parse_config
from epp.scheduling.plugins.prefix.precise_prefix_cache_producer import (
    PrecisePrefixCacheProducer,
)
from epp.scheduling.plugins.prefix.prefix_cache_scorer import PrefixCacheScorer
from epp.scheduling.request import LLMRequest
from sim import start_fleet
from sim.kvevents import KVEventsConfig
from sim.tokenizer import token_ids
from tests.epp.kvcache.test_precise_prefix_envoy import OFFSET, free_run
from tests.epp.kvcache.test_precise_prefix_scorer import MODEL, pool, until
from tests.support.sim import tiny

CONFIG = f"""\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSizeTokens: 16}}
    kvEventsConfig: {{podDiscoveryConfig: {{socketPortOffset: {OFFSET}}}}}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- name: by-length
  type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
    matchLengthWeight: 0.5
    matchLengthScaleTokens: 64
- type: endpoint-notification-source
dataLayer:
  sources:
  - pluginRef: endpoint-notification-source
    extractors: [{{pluginRef: precise-prefix-cache-producer}}]
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: prefix-cache-scorer}}, {{pluginRef: by-length}}]
"""


async def test_the_generic_scorer_reads_the_precise_producers_kv_events() -> None:
    base = free_run()
    cfgs = [tiny(model=MODEL, port=base, kv_events=KVEventsConfig(
                enable_kv_cache_events=True, endpoint=f"tcp://*:{base + OFFSET}",
                topic="kv@{host}@{model}")),
            tiny(model=MODEL, port=base + 1, kv_events=KVEventsConfig(
                enable_kv_cache_events=True, endpoint=f"tcp://*:{base + 1 + OFFSET}",
                topic="kv@{host}@{model}"))]
    ds = pool(base, 2)
    runtime = build(parse_config(CONFIG), ds)
    producer = runtime.handle.plugin("precise-prefix-cache-producer", PrecisePrefixCacheProducer)
    scorer = runtime.handle.plugin("prefix-cache-scorer", PrefixCacheScorer)
    by_length = runtime.handle.plugin("by-length", PrefixCacheScorer)
    assert producer in runtime.producers and scorer.precise is producer
    (source,) = [s for s in runtime.data_sources if s.type_name == "endpoint-notification-source"]
    async with start_fleet(cfgs) as fleet, httpx.AsyncClient(timeout=10) as client:
        task = asyncio.create_task(source.run(ds))
        try:
            k0, k1 = f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"
            await until(lambda: producer.live(k0) and producer.live(k1), "both subscribed")
            fill = 0
            while not producer.index.endpoint_blocks().get(k0):  # past ZMQ's slow joiner
                r = await client.post(fleet.urls[0] + "/v1/completions", json={
                    "model": MODEL, "prompt": f"filler {fill} " * 30, "max_tokens": 1})
                assert r.status_code == 200
                fill += 1
                await asyncio.sleep(0.05)
            prompt = "a prompt only server zero has served, for the split test. " * 8
            r = await client.post(fleet.urls[0] + "/v1/completions",
                                  json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
            assert r.status_code == 200
            ids = token_ids(prompt.encode())
            blocks = len(ids) // 16
            await until(lambda: producer.index.score(ids, "").get(k0) == blocks, "indexed")

            views = ds.views()
            req = LLMRequest("r", MODEL, prompt_token_ids=ids)
            for p in runtime.producers:  # what the director does before scheduling
                p.produce(req, views)
            # Server 0 holds every block by its own events; server 1 none.
            assert list(scorer.score(req, views)) == [1.0, 0.0]
            # w = 0.5: 0.5 x min(1, blocks x 16 / 64)^2 + 0.5 x ratio = 1.0 and 0.0.
            assert list(by_length.score(req, views)) == [1.0, 0.0]
            half = LLMRequest("h", MODEL, prompt_token_ids=ids[:16] + [7] * (len(ids) - 16))
            for p in runtime.producers:
                p.produce(half, views)
            ratio = 1 / blocks  # only the first block matches
            length = min(1.0, 16 / 64) ** 2
            assert list(by_length.score(half, views)) == [0.5 * length + 0.5 * ratio, 0.0]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
