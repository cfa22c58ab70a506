"""shared.tracing: upstream's OTEL_* settings, the caller's traceparent continued, and no
span built for a request that is not sampled. Spans are read on a real OTLP/gRPC receiver."""

from __future__ import annotations

import json
import random
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from devkit.otlp import OtlpReceiver
from epp.scheduling import LLMRequest, Scheduler, SchedulingProfile, WeightedScorer
from epp.scheduling.plugins import MaxScorePicker, SingleProfileHandler
from epp.scheduling.plugins.scorer.queue_scorer import QueueScorer
from shared import tracing
from tests.support.views import build_view


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r
    tracing.shutdown()


def configure(receiver: OtlpReceiver, **env: str) -> None:
    assert tracing.configure(True, "epp", env={
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        **env}) == "otlp"


def flush() -> None:
    assert tracing._provider is not None
    tracing._provider.force_flush()


def test_default_sampler_is_upstreams_parent_based_ratio_of_a_tenth() -> None:
    sampler = tracing.sampler_from_env({})
    assert sampler.get_description() == (
        "ParentBased{root:TraceIdRatioBased{0.1},remoteParentSampled:AlwaysOnSampler,"
        "remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,"
        "localParentNotSampled:AlwaysOffSampler}")
    assert "TraceIdRatioBased{0.5}" in tracing.sampler_from_env(
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    ).get_description()


@pytest.mark.parametrize(("env", "named"), [
    ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
    ({"OTEL_TRACES_SAMPLER_ARG": "half"}, "OTEL_TRACES_SAMPLER_ARG"),
    ({"OTEL_TRACES_SAMPLER_ARG": "1.5"}, "OTEL_TRACES_SAMPLER_ARG"),
])
def test_a_bad_sampler_setting_is_an_error_naming_the_variable(env: dict[str, str],
                                                               named: str) -> None:
    with pytest.raises(tracing.TracingConfigError, match=named):
        tracing.sampler_from_env(env)


def test_exporter_defaults_to_console_only_when_the_flag_is_written() -> None:
    assert tracing.exporter_name({}, flag_given=False) == "none"
    assert tracing.exporter_name({}, flag_given=True) == "console"
    assert tracing.exporter_name({"OTEL_TRACES_EXPORTER": "OTLP"}, flag_given=False) == "otlp"
    with pytest.raises(tracing.TracingConfigError, match="OTEL_TRACES_EXPORTER"):
        tracing.exporter_name({"OTEL_TRACES_EXPORTER": "jaeger"}, flag_given=True)


def test_tracing_off_builds_nothing() -> None:
    assert tracing.configure(False, "epp", flag_given=True) == "none"
    assert tracing.TRACER is None
    assert tracing.start_request("gateway.request", {}) is None


def test_bad_variable_stops_the_service_with_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bbr.main", "--tracing=true", "--grpc-port", "0"],
        capture_output=True, text=True, timeout=60,
        env={"OTEL_TRACES_SAMPLER": "sometimes", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "bbr: error: OTEL_TRACES_SAMPLER='sometimes' is not one of always_on, always_off, "
        "traceidratio, parentbased_always_on, parentbased_always_off, "
        "parentbased_traceidratio"]


def test_a_sampled_traceparent_is_continued(receiver: OtlpReceiver) -> None:
    configure(receiver, OTEL_TRACES_SAMPLER_ARG="0")  # only a sampled parent gets through
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    trace = tracing.start_request("gateway.request",
                                  {"traceparent": f"00-{trace_id}-{parent}-01"})
    assert trace is not None
    trace.span("parse").end()
    trace.root.end()
    flush()
    spans = receiver.wait_for(lambda s: len(s) >= 2)
    root = next(s for s in spans if s.name == "gateway.request")
    assert root.trace_id == trace_id and root.parent_span_id == parent
    assert root.service == "epp" and root.kind == 2  # SERVER
    assert next(s for s in spans if s.name == "parse").parent_span_id == root.span_id


def test_the_grpc_calls_traceparent_wins_over_the_clients(receiver: OtlpReceiver) -> None:
    configure(receiver)
    client = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    envoy_trace, envoy_span = secrets.token_hex(16), secrets.token_hex(8)
    trace = tracing.start_request("gateway.request", {"traceparent": client},
                                  grpc_traceparent=f"00-{envoy_trace}-{envoy_span}-01")
    assert trace is not None
    trace.root.end()
    flush()
    (root,) = receiver.wait_for(lambda s: len(s) >= 1)
    assert (root.trace_id, root.parent_span_id) == (envoy_trace, envoy_span)


def test_an_unsampled_request_gets_no_trace_and_the_scheduler_no_span(
        receiver: OtlpReceiver) -> None:
    configure(receiver, OTEL_TRACES_SAMPLER="parentbased_always_on")
    unsampled = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"
    assert tracing.start_request("gateway.request", {"traceparent": unsampled}) is None
    scheduler = Scheduler([SchedulingProfile("default", MaxScorePicker(), [],
                                             [WeightedScorer(QueueScorer(), 1.0)])],
                          SingleProfileHandler(), rng=random.Random(0))
    views = [build_view(0, waiting=3), build_view(1)]
    request = LLMRequest(request_id="r", target_model="m")  # trace None: not sampled
    assert scheduler.schedule(request, views).endpoints == [views[1]]
    # The same request sampled: the profile and its scorer and picker are spans.
    sampled = tracing.start_request("gateway.request", {})
    assert sampled is not None
    traced = LLMRequest(request_id="t", target_model="m", trace=sampled)
    assert scheduler.schedule(traced, views).endpoints == [views[1]]
    sampled.root.end()
    flush()
    spans = receiver.wait_for(lambda s: len(s) >= 4)
    assert {s.trace_id for s in spans} == {spans[0].trace_id}  # only the sampled request's
    scorer = next(s for s in spans if s.name == "llm_d.epp.scorer.queue-scorer")
    assert scorer.attributes["llm_d.epp.scorer.endpoints"] == ["10.0.0.0:8000", "10.0.0.1:8000"]
    assert scorer.attributes["llm_d.epp.scorer.scores"] == [0.0, 1.0]


def test_an_error_answer_fails_the_span_and_a_direct_answer_does_not(
        receiver: OtlpReceiver) -> None:
    from shared.errors import BadRequest, DirectResponse

    configure(receiver, OTEL_TRACES_SAMPLER="always_on")
    trace = tracing.start_request("gateway.request", {})
    assert trace is not None
    bad, listing = trace.span("bad"), trace.span("listing")
    trace.fail(bad, BadRequest("no model", code="missing_model"))
    trace.fail(listing, DirectResponse(b"{}"))
    for span in (bad, listing, trace.root):
        span.end()
    flush()
    spans = {s.name: s for s in receiver.wait_for(lambda s: len(s) >= 3)}
    assert spans["bad"].status == 2  # STATUS_CODE_ERROR
    assert spans["bad"].attributes == {"http.response.status_code": 400,
                                       "error.type": "missing_model"}
    assert spans["listing"].status == 0
    assert spans["listing"].attributes == {"http.response.status_code": 200}


def test_console_export_writes_one_json_line_per_span() -> None:
    """``OTEL_TRACES_EXPORTER=console``: our spans reach the SDK's console exporter as SDK
    ``ReadableSpan`` JSON, one object per line (the services' stdout stays line JSON)."""
    code = ("from shared import tracing\n"
            "tracing.configure(True, 'epp', env={'OTEL_TRACES_EXPORTER': 'console',"
            " 'OTEL_TRACES_SAMPLER': 'always_on'})\n"
            "t = tracing.start_request('gateway.request', {})\n"
            "t.span('parse', {'http.request.body.size': 9}).end()\n"
            "t.root.end()\n"
            "tracing.shutdown()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    spans = [json.loads(line) for line in out.splitlines()]
    assert [s["name"] for s in spans] == ["parse", "gateway.request"]
    assert spans[0]["attributes"] == {"http.request.body.size": 9}
    assert spans[0]["parent_id"] == spans[1]["context"]["span_id"]
    assert spans[1]["kind"] == "SpanKind.SERVER"


@pytest.mark.parametrize("sampler", ["traceidratio", "parentbased_traceidratio"])
def test_a_new_trace_is_kept_as_the_ratio_sampler_keeps_its_id(receiver: OtlpReceiver,
                                                                sampler: str) -> None:
    """Without a parent, the ratio decision is taken on the drawn id's low 64 bits before
    anything is built: the kept share is the ratio, and every kept id is one the SDK's own
    sampler keeps."""
    configure(receiver, OTEL_TRACES_SAMPLER=sampler, OTEL_TRACES_SAMPLER_ARG="0.25")
    sdk = tracing.sampler_from_env({"OTEL_TRACES_SAMPLER": "traceidratio",
                                    "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    kept = [t for _ in range(4000) if (t := tracing.start_request("r", {})) is not None]
    assert 0.21 < len(kept) / 4000 < 0.29
    ids = [t.root.context.trace_id for t in kept]
    assert all(sdk.should_sample(None, i, "r").decision.is_sampled() for i in ids)
    assert len(set(ids)) == len(ids) and all(i >> 64 for i in ids)  # valid, distinct ids
    configure(receiver, OTEL_TRACES_SAMPLER=sampler, OTEL_TRACES_SAMPLER_ARG="0")
    assert all(tracing.start_request("r", {}) is None for _ in range(1000))


def test_a_full_batch_is_exported_without_waiting_for_the_delay(receiver: OtlpReceiver) -> None:
    configure(receiver, OTEL_TRACES_SAMPLER="always_on", OTEL_BSP_SCHEDULE_DELAY="600000",
              OTEL_BSP_MAX_EXPORT_BATCH_SIZE="4")
    for _ in range(2):
        tracing.start_request("r", {}).root.end()  # type: ignore[union-attr]
    time.sleep(0.3)
    assert receiver.spans == []  # half a batch waits (for 10 minutes)
    for _ in range(2):
        tracing.start_request("r", {}).root.end()  # type: ignore[union-attr]
    assert len(receiver.wait_for(lambda s: len(s) >= 4, timeout=5)) == 4


def test_spans_past_the_queue_limit_are_dropped_counted_and_warned_once(
        receiver: OtlpReceiver, capsys: pytest.CaptureFixture[str]) -> None:
    configure(receiver, OTEL_TRACES_SAMPLER="always_on", OTEL_BSP_SCHEDULE_DELAY="600000",
              OTEL_BSP_MAX_QUEUE_SIZE="3")
    for _ in range(5):
        tracing.start_request("r", {}).root.end()  # type: ignore[union-attr]
    flush()
    assert len(receiver.wait_for(lambda s: len(s) >= 3)) == 3
    warned = [line for line in capsys.readouterr().out.splitlines() if "spans dropped" in line]
    assert len(warned) == 1 and "dropped=2" in warned[0]


@pytest.mark.parametrize("name", ["OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_QUEUE_SIZE",
                                  "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"])
@pytest.mark.parametrize("value", ["soon", "0"])
def test_a_bad_batch_setting_is_an_error_naming_the_variable(receiver: OtlpReceiver, name: str,
                                                             value: str) -> None:
    with pytest.raises(tracing.TracingConfigError, match=name):
        configure(receiver, **{name: value})


def test_a_counting_receiver_counts_what_a_keeping_one_keeps() -> None:
    with OtlpReceiver(count_only=True) as counter:
        configure(counter, OTEL_TRACES_SAMPLER="always_on")
        for _ in range(3):
            trace = tracing.start_request("r", {})
            assert trace is not None
            trace.span("parse").end()
            trace.root.end()
        flush()
        deadline = time.monotonic() + 10
        while counter.count < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        tracing.shutdown()
    assert (counter.count, counter.spans) == (6, [])
