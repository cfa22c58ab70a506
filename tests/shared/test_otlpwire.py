"""shared.otlpwire writes the same ExportTraceServiceRequest as the SDK's own encoder."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import SpanProcessor

from shared import otlpwire, tracing
from shared.errors import NotFound


class Collect(SpanProcessor):
    """A span processor that keeps what ends (the SDK's processor interface)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def on_end(self, span: Any) -> None:
        self.spans.append(span)


@pytest.fixture
def collected() -> Iterator[Collect]:
    assert tracing.configure(True, "epp", env={"OTEL_TRACES_EXPORTER": "console",
                                               "OTEL_TRACES_SAMPLER": "always_on"}) == "console"
    sink = Collect()
    assert tracing._provider is not None and tracing._api is not None
    tracing._provider.add_span_processor(sink)
    tracing._api.processor = sink
    yield sink
    tracing.shutdown()


def test_the_request_decodes_to_what_the_sdk_encoder_writes(collected: Collect) -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    trace = tracing.start_request("gateway.request", {"traceparent": parent})
    assert trace is not None
    trace.root.set_attributes({"gen_ai.request.model": "llama", "gen_ai.usage.input_tokens": 7,
                               "gen_ai.server.time_to_first_token": 0.25, "ok": True,
                               "picked": ("10.0.0.1:8000", "10.0.0.2:8000")})
    profile = trace.span("run_scheduler_profile", {"llm_d.epp.scheduling.profile.name": "d"})
    scorer = trace.span("llm_d.epp.scorer.queue-scorer", {"llm_d.epp.scorer.weight": 2.0},
                        parent=profile)
    scorer.set_attributes({"llm_d.epp.scorer.scores": [0.0, 1.0, -1.5],
                           "llm_d.epp.scorer.endpoints": ["a:1", "b:2", "c:3"],
                           "big": 2**63 - 1, "negative": -3, "unicode": "modèle-日本語"})
    scorer.end()
    profile.end()
    trace.fail(trace.root, NotFound("no such model"))
    trace.root.end()
    assert len(collected.spans) == 3
    ours = ExportTraceServiceRequest.FromString(otlpwire.export_request(collected.spans))
    sdk = encode_spans([s.readable() for s in collected.spans])
    for req in (ours, sdk):  # fields we do not write (see the module docstring)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                ss.scope.ClearField("attributes")
                for s in ss.spans:
                    s.ClearField("flags")
                    s.ClearField("trace_state")
                    if not s.status.code:  # an empty Status is UNSET too
                        s.ClearField("status")
    assert ours == sdk
    spans = {s.name: s for s in ours.resource_spans[0].scope_spans[0].spans}
    assert spans["gateway.request"].status.code == 2
    assert spans["gateway.request"].parent_span_id.hex() == "00f067aa0ba902b7"
    assert spans["llm_d.epp.scorer.queue-scorer"].parent_span_id == spans[
        "run_scheduler_profile"].span_id


def test_cached_attributes_keep_bool_and_int_apart() -> None:
    """Encodings of repeated values are cached; ``True == 1`` must not share an entry."""
    for attrs in ({"a": True}, {"a": 1}, {"a": True}, {"a": "1"}):
        encoded = otlpwire.attributes(attrs, 1)
        # request.resource_spans[0].resource.attributes: fields 1, 1 and 1
        decoded = ExportTraceServiceRequest.FromString(otlpwire._ld(1, otlpwire._ld(1, encoded)))
        value = decoded.resource_spans[0].resource.attributes[0].value
        assert value.WhichOneof("value") == {bool: "bool_value", int: "int_value",
                                             str: "string_value"}[type(attrs["a"])]
