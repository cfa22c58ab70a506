"""The director on its own: a real runtime over a real datastore, no Envoy. Plugins here are
real plugins written for the test (they record what the director asked of them)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from devkit.manifests import pool_manifests
from epp.config import BUILTIN_PLUGINS, build, parse_config
from epp.datastore import Datastore, EndpointMetrics, EndpointView
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.requestcontrol import Director
from epp.requestcontrol.plugin import (
    Admitter,
    DataProducer,
    PreRequest,
    Response,
    ResponseComplete,
    ResponseReceived,
    ResponseStreaming,
)
from epp.scheduling import LLMRequest, Plugin, SchedulingResult
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from shared.errors import TooManyRequests
from shared.plugins import PluginRegistry

KEYS = ("10.1.0.1:8000", "10.1.0.2:8000", "10.1.0.3:8000")
CALLS: list[str] = []


class TraceHooks(Plugin, DataProducer, Admitter, PreRequest, ResponseReceived,
                 ResponseStreaming, ResponseComplete):
    """Records each extension point it is called at."""

    type_name = "trace-hooks"

    def produce(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        CALLS.append("produce")

    def admit(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        CALLS.append("admit")

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        CALLS.append("pre_request")
        result.extra_headers["x-prefill-endpoint"] = result.endpoints[-1].key

    def response_received(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        CALLS.append(f"response_received {response.status}")

    def response_streaming(self, request: LLMRequest, response: Response, chunk: bytes,
                           endpoint: EndpointView) -> None:
        CALLS.append("response_streaming")

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        CALLS.append(f"response_complete {endpoint.inflight_requests}")


class RejectAll(Plugin, Admitter):
    type_name = "reject-all"

    def admit(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        raise TooManyRequests("queue full", code="queue_full")


class WaitThenAdmit(Plugin, Admitter):
    """Awaits (as a queueing admitter would) before admitting."""

    type_name = "wait-then-admit"

    async def admit(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        await asyncio.sleep(0)
        CALLS.append("admitted after waiting")


def store() -> Datastore:
    pods = [(f"pod-{i}", key.split(":")[0]) for i, key in enumerate(KEYS)]
    objects = [parse_object(d) for d in pool_manifests("pool", pods, 8000)]
    ds = Datastore()
    ds.replace(build_snapshot([o for o in objects if o is not None], pool_name="pool",
                              pool_namespace="default"))
    for view in ds.views():
        view.begin_scrape()
        ds.record_scrape(view, EndpointMetrics(waiting=0, running=0, kv_usage=0.0,
                                               updated_at=time.monotonic() + 3600))
    return ds


def director(*types: str) -> Director:
    CALLS.clear()
    registry = PluginRegistry((*BUILTIN_PLUGINS, TraceHooks, RejectAll, WaitThenAdmit))
    text = "plugins:\n- type: queue-scorer\n" + "".join(f"- type: {t}\n" for t in types)
    return Director.of(build(parse_config(text), store(), registry=registry,
                             rng=random.Random(0)))


def body(prompt: str = "hello " * 40) -> bytes:
    return orjson.dumps({"model": "m", "prompt": prompt})


HEADERS: dict[str, Any] = {":path": "/v1/completions", "x-request-id": "r1"}


def test_extension_points_run_in_upstream_order() -> None:
    d = director("trace-hooks")
    _, routed = d.route(HEADERS, body(), {})
    d.response_received(routed, 200, {})
    d.response_chunk(routed, b"data: {}\n\n", True)
    d.finish(routed, completed=True, status=200, response_size=10, prompt_tokens=3,
             completion_tokens=2)
    # the trace's response_complete runs before the in-flight release (ours run last)
    assert CALLS == ["produce", "admit", "pre_request", "response_received 200",
                     "response_streaming", "response_complete 1"]


def test_pre_request_plugin_adds_headers_for_envoy() -> None:
    decision, routed = director("trace-hooks").route(HEADERS, body(), {})
    assert decision.set_headers["x-prefill-endpoint"] == routed.endpoint.key


def test_in_flight_accounting_follows_the_request() -> None:
    d = director()
    _, routed = d.route(HEADERS, body("x" * 400), {})
    during = (routed.endpoint.inflight_requests, routed.endpoint.inflight_tokens)
    d.finish(routed, completed=False, status=200, response_size=0, prompt_tokens=0,
             completion_tokens=0)
    after = (routed.endpoint.inflight_requests, routed.endpoint.inflight_tokens)
    assert (during, after) == ((1, routed.request.prompt_tokens), (0, 0))


def test_rejecting_admitter_stops_the_request_before_any_commit() -> None:
    d = director("trace-hooks", "reject-all")
    with pytest.raises(TooManyRequests, match="queue full"):
        d.route(HEADERS, body(), {})
    assert "pre_request" not in CALLS
    assert [v.inflight_requests for v in d.datastore.views()] == [0, 0, 0]


def test_an_admitter_may_await_before_admitting() -> None:
    d = director("wait-then-admit")

    async def go() -> str:
        pending = d.prepare(HEADERS, body(), {})
        await d.admit(pending)
        _, routed = d.dispatch(pending)
        return routed.endpoint.key

    assert asyncio.run(go()) in KEYS
    assert CALLS == ["admitted after waiting"]


def test_route_refuses_an_awaiting_admitter_instead_of_skipping_it() -> None:
    with pytest.raises(RuntimeError, match=r"use Director\.admit"):
        director("wait-then-admit").route(HEADERS, body(), {})


def test_the_prefix_producer_learns_at_pre_request_and_the_scorer_follows() -> None:
    d = Director.of(build(parse_config(None), store(), rng=random.Random(0)))
    (producer,) = d.runtime.handle.find(ApproxPrefixCacheProducer)
    _, first = d.route(HEADERS, body(), {})
    learnt = producer.indexer_size
    d.finish(first, completed=True, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=1)
    _, second = d.route(HEADERS, body(), {})
    assert learnt > 0
    assert second.endpoint is first.endpoint


def test_response_carries_usage_ttft_and_tpot() -> None:
    d = director()
    _, routed = d.route(HEADERS, body(), {})
    d.response_chunk(routed, b"data: {}\n\n", True)
    d.finish(routed, completed=True, status=200, response_size=5, prompt_tokens=7,
             completion_tokens=5)
    r = routed.response
    assert r.ttft is not None and 0 <= r.ttft <= r.elapsed
    assert (r.prompt_tokens, r.completion_tokens) == (7, 5)
    assert r.tpot == pytest.approx((r.elapsed - r.ttft) / 4)


def test_a_non_streamed_response_has_ttft_of_the_whole_duration_and_tpot_over_all_tokens(
) -> None:
    d = director()
    _, routed = d.route(HEADERS, body(), {})
    d.response_received(routed, 200, {"content-type": "application/json"})
    d.finish(routed, completed=True, status=200, response_size=5, prompt_tokens=7,
             completion_tokens=4)
    r = routed.response
    assert r.ttft == r.elapsed
    assert r.tpot == pytest.approx(r.elapsed / 4)


def test_a_broken_non_streamed_response_has_no_ttft() -> None:
    d = director()
    _, routed = d.route(HEADERS, body(), {})
    d.response_received(routed, 200, {"content-type": "application/json"})
    d.finish(routed, completed=False, status=200, response_size=0, prompt_tokens=0,
             completion_tokens=0)
    assert routed.response.ttft is None


def test_a_streamed_response_without_tokens_has_no_ttft() -> None:
    d = director()
    _, routed = d.route(HEADERS, body(), {})
    d.response_received(routed, 200, {"content-type": "text/event-stream"})
    d.finish(routed, completed=True, status=200, response_size=0, prompt_tokens=0,
             completion_tokens=0)
    assert routed.response.streamed and routed.response.ttft is None


def test_endpoints_leaving_the_pool_are_forgotten_by_every_plugin() -> None:
    d = Director.of(build(parse_config(None), store(), rng=random.Random(0)))
    (producer,) = d.runtime.handle.find(ApproxPrefixCacheProducer)
    d.route(HEADERS, body(), {})
    d.runtime.retain_endpoints(frozenset())
    assert producer.indexer_size == 0
