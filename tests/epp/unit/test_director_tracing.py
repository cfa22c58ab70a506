"""The director's spans for a sampled request: parse, the admission wait, each profile and
pre-request, in one trace (read on a real OTLP/gRPC receiver)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from devkit.otlp import OtlpReceiver
from shared import tracing
from tests.epp.unit.test_director import HEADERS, KEYS, body, director


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        assert tracing.configure(True, "llm-d-epp", env={
            "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": r.endpoint,
            "OTEL_TRACES_SAMPLER": "always_on"}) == "otlp"
        yield r
        tracing.shutdown()


def test_a_sampled_request_gets_a_span_per_step_of_the_director(
        receiver: OtlpReceiver) -> None:
    d = director("wait-then-admit")
    trace = tracing.start_request("gateway.request", HEADERS)
    assert trace is not None

    async def go() -> str:
        pending = d.prepare(HEADERS, body(), {}, trace)
        assert pending.request.trace is trace
        await d.admit(pending)
        _, routed = d.dispatch(pending)
        return routed.endpoint.key

    picked = asyncio.run(go())
    trace.root.end()
    assert tracing._provider is not None
    tracing._provider.force_flush()
    spans = {s.name: s for s in receiver.wait_for(lambda s: len(s) >= 6)}
    root = spans["gateway.request"]
    for name in ("parse", "flow_control_wait", "run_scheduler_profile", "pre_request"):
        assert spans[name].parent_span_id == root.span_id, name
    order = sorted(("parse", "flow_control_wait", "run_scheduler_profile", "pre_request"),
                   key=lambda n: spans[n].start_ns)
    assert order == ["parse", "flow_control_wait", "run_scheduler_profile", "pre_request"]
    assert spans["flow_control_wait"].attributes["llm_d.epp.admitter.type"] == "wait-then-admit"
    assert spans["parse"].attributes["gen_ai.request.model"] == "m"
    assert spans["run_scheduler_profile"].attributes["llm_d.epp.scheduling.picked"] == [picked]
    scorer = spans["llm_d.epp.scorer.queue-scorer"]
    assert scorer.parent_span_id == spans["run_scheduler_profile"].span_id
    assert sorted(scorer.attributes["llm_d.epp.scorer.endpoints"]) == sorted(KEYS)
    assert root.attributes["gen_ai.request.model"] == "m"
    assert root.attributes["llm_d.epp.destination"] == picked
