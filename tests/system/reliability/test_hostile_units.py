"""Hostile input at unit level (hypothesis): every input gets a defined answer, no exception
escapes an ext_proc stream, and memory stays bounded.

Inputs tried per run: the ``max_examples`` of each test below (see docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bbr.basemodels import StaticBaseModels
from bbr.plugins import build
from bbr.router import BodyRouter
from epp.datastore import EngineType
from epp.datastore.objects import KNOWN_KINDS, ObjectError, parse_object
from epp.metrics.dialects import DIALECTS, MetricsError, parse_metrics
from epp.requestcontrol.response import ResponseRewriter
from epp.sources.manifests import ManifestError, parse_files
from shared.errors import GatewayError
from shared.extproc import BodyMode, ExtProcServicer
from tests.support.inprocess import (
    POOL_KEYS,
    body_msgs,
    director,
    headers_msg,
    iterate,
    picker_servicer,
    request_outcome,
    run_stream,
)


def fast(n: int) -> settings:
    """``n`` examples, no per-example deadline (some inputs are megabytes)."""
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

MAX_BODY = 64 * 1024

# --- strategies ------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=50))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=5),
    max_leaves=30)
MODELS = ("base-model", "pool-b-model", "", "m" * 300, "modèle-日本語", "a,b", "x\r\ny: z")


@st.composite
def hostile_bodies(draw: st.DrawFn) -> bytes:
    """Bodies a client might send: valid, almost valid, or garbage."""
    kind = draw(st.sampled_from(["valid", "wrong_types", "garbage", "deep", "truncated",
                                 "duplicate_keys", "bad_utf8", "huge", "json_value"]))
    model = draw(st.sampled_from(MODELS) | st.text(max_size=30))
    valid = orjson.dumps({"model": model, "prompt": draw(st.text(max_size=100)),
                          "messages": [{"role": "user", "content": draw(st.text(max_size=50))}],
                          "stream": draw(st.booleans())})
    if kind == "valid":
        return valid
    if kind == "wrong_types":
        return orjson.dumps({"model": draw(json_values), "prompt": draw(json_values),
                             "messages": draw(json_values)})
    if kind == "garbage":
        return draw(st.binary(max_size=300))
    if kind == "deep":
        n = draw(st.integers(1, 3000))
        return b'{"model":"base-model","prompt":' + b"[" * n + b"]" * n + b"}"
    if kind == "truncated":
        return valid[: draw(st.integers(0, len(valid)))]
    if kind == "duplicate_keys":
        return b'{"model":"base-model","prompt":"x","model":' + orjson.dumps(model) + b"}"
    if kind == "bad_utf8":
        return b'{"model":"\xff\xfe' + draw(st.binary(max_size=10)) + b'","prompt":"x"}'
    if kind == "huge":
        return orjson.dumps({"model": "base-model",
                             "prompt": "x" * draw(st.integers(MAX_BODY - 100, MAX_BODY + 100))})
    return orjson.dumps(draw(json_values))


hostile_header_values = st.one_of(
    st.sampled_from([*POOL_KEYS, "127.0.0.1:1", "10.9.9.9:80", "10.1.0.1:8000,127.0.0.1:1",
                     "", " ", "127.0.0.1:1\x00", "[::1]:80", "localhost:80"]),
    st.text(max_size=40))
control_header_names = st.sampled_from([
    "x-gateway-destination-endpoint", "x-gateway-destination-endpoint-subset",
    "x-gateway-destination-endpoint-served", "x-gateway-destination-endpoint-fallback",
    "x-gateway-model-name", "x-gateway-model-name-rewrite", "x-gateway-inference-objective",
    "x-request-id", "x-gateway-inference-fairness-id"])
hostile_headers = st.lists(st.tuples(control_header_names, hostile_header_values), max_size=6)


# --- request bodies ----------------------------------------------------------------------------

@fast(400)
@given(body=hostile_bodies())
def test_bbr_answers_every_body_with_headers_or_a_400(body: bytes) -> None:
    router = BodyRouter(build([], StaticBaseModels()))
    try:
        decision = router.decide(body)
    except GatewayError as e:
        assert e.status == 400
        assert set(e.to_json()["error"]) == {"message", "type", "code"}
        return
    assert decision.clear_route_cache or not body
    assert all(isinstance(v, str) for v in decision.set_headers.values())


@pytest.mark.parametrize("mode", [BodyMode.BUFFERED, BodyMode.FULL_DUPLEX_STREAMED])
@fast(300)
@given(body=hostile_bodies(), headers=hostile_headers,
       path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/x"]),
       cuts=st.lists(st.integers(0, 4000), max_size=4))
def test_epp_stream_answers_every_body_with_a_pool_endpoint_or_a_json_4xx(
        mode: BodyMode, body: bytes, headers: list[tuple[str, str]], path: str,
        cuts: list[int]) -> None:
    d = director()
    servicer = picker_servicer(d, mode, MAX_BODY)
    msgs = [headers_msg([(":method", "POST"), (":path", path), *headers])]
    msgs += body_msgs(body, cuts if mode is BodyMode.FULL_DUPLEX_STREAMED else [])
    status, set_headers, error_body = request_outcome(run_stream(servicer, msgs))
    if status:
        assert status in (400, 413), status
        assert set(orjson.loads(error_body)["error"]) == {"message", "type", "code"}
    else:
        assert set_headers["x-gateway-destination-endpoint"] in POOL_KEYS
    assert all(v.inflight_requests == 0 for v in d.datastore.views())


def test_stream_memory_stays_bounded_over_many_hostile_requests() -> None:
    d = director()
    servicer = picker_servicer(d, BodyMode.FULL_DUPLEX_STREAMED, MAX_BODY)
    bodies = [b'{"model":"base-model","prompt":"hi"}', b"{not json", b"[" * 2000,
              orjson.dumps({"model": "base-model", "prompt": "x" * (MAX_BODY + 1)}),
              b'{"model":"base-model","prompt":"x","model":"base-model"}']

    def batch(n: int) -> None:
        async def go() -> None:
            for i in range(n):
                msgs = [headers_msg([(":method", "POST"), (":path", "/v1/completions"),
                                     ("x-gateway-destination-endpoint", "127.0.0.1:1")])]
                msgs += body_msgs(bodies[i % len(bodies)], [7, 100])
                async for _ in servicer.Process(iterate(msgs), None):
                    pass

        asyncio.run(go())

    batch(300)  # warm caches, metric label sets, interned strings
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.take_snapshot()
        batch(3000)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    diff = after.compare_to(before, "filename")
    growth = sum(s.size_diff for s in diff)
    assert growth < 512 * 1024, f"{growth} bytes kept after 3000 requests: {diff[:3]}"


# --- SSE responses -----------------------------------------------------------------------------

@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, str, str]:
    """(stream bytes, client model, target model): SSE events, sometimes with junk."""
    target = draw(st.sampled_from(["target", "t\n\"x", "模型", "a:b"]))
    client = draw(st.sampled_from(["client", target, "c\\d"]))
    parts = []
    for _ in range(draw(st.integers(0, 8))):
        ev: dict[str, Any] = {"id": "x", "model": draw(st.sampled_from([target, "other"])),
                              "choices": [{"text": draw(st.text(max_size=20))}]}
        if draw(st.booleans()):
            ev["usage"] = {"prompt_tokens": draw(st.integers(0, 10**6)),
                           "completion_tokens": draw(st.integers(0, 10**6))}
        sep = draw(st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n"]))
        parts.append(b"data: " + orjson.dumps(ev) + sep)
        if draw(st.integers(0, 9)) == 0:
            parts.append(draw(st.binary(max_size=30)))
    parts.append(draw(st.sampled_from([b"data: [DONE]\n\n", b"", b"data: {\"usage\":{"])))
    return b"".join(parts), client, target


@fast(600)
@given(stream=sse_streams(), cuts=st.lists(st.integers(0, 3000), max_size=12))
def test_sse_rewrite_is_the_same_however_the_stream_is_cut(
        stream: tuple[bytes, str, str], cuts: list[int]) -> None:
    data, client, target = stream
    whole = ResponseRewriter(client, target)
    expected = whole.chunk(data, True)
    chunked = ResponseRewriter(client, target)
    points = sorted({c for c in cuts if 0 < c < len(data)})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    out = b"".join(chunked.chunk(p, i == len(pieces) - 1) for i, p in enumerate(pieces))
    assert out == expected
    assert chunked.usage == whole.usage


@fast(300)
@given(stream=sse_streams(), cuts=st.lists(st.integers(0, 3000), max_size=6))
def test_sse_usage_is_the_last_usage_event_sent(stream: tuple[bytes, str, str],
                                                cuts: list[int]) -> None:
    data, client, target = stream
    rw = ResponseRewriter(client, target)
    points = sorted({c for c in cuts if 0 < c < len(data)})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    for i, p in enumerate(pieces):
        rw.chunk(p, i == len(pieces) - 1)
    last = None
    for line in data.split(b"\n"):
        if line.startswith(b"data: {"):
            try:
                ev = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                continue
            if isinstance(ev, dict) and isinstance(ev.get("usage"), dict):
                last = ev["usage"]
    if last is not None:
        assert (rw.usage.prompt_tokens, rw.usage.completion_tokens) == (
            last["prompt_tokens"], last["completion_tokens"])


# --- Prometheus text ---------------------------------------------------------------------------

LIES = ["NaN", "+Inf", "-Inf", "-3", "1e308", "1e400", "-0", "2.5", "abc", "0x10", "1e-400",
        "17", "99999999999999999999999"]


@st.composite
def prometheus_pages(draw: st.DrawFn) -> tuple[str, EngineType]:
    engine = draw(st.sampled_from(list(DIALECTS)))
    d = DIALECTS[engine]
    names = [*d.families, *d.kv_usage, "other_metric"]
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        if draw(st.integers(0, 4)) == 0:
            lines.append(draw(st.text(max_size=60)))
            continue
        labels = draw(st.dictionaries(
            st.sampled_from(["model_name", "request_type", "kv_cache_block_type", "block_size",
                             "num_gpu_blocks", "page_size", "num_pages", "max_lora",
                             "running_lora_adapters", "waiting_lora_adapters"]),
            st.sampled_from(["waiting", "scheduled", "fraction", *LIES, "a,b", 'q\\"x', ""]),
            max_size=4))
        body = ",".join(f'{k}="{v}"' for k, v in labels.items())
        cut = draw(st.sampled_from(["", "{", "}", '"']))
        value = draw(st.sampled_from(LIES))
        lines.append(f"{draw(st.sampled_from(names))}{{{body}}}{cut} {value}")
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"])), engine


@fast(1000)
@given(page=prometheus_pages())
def test_metrics_page_yields_sane_values_or_a_metrics_error(page: tuple[str, EngineType]) -> None:
    text, engine = page
    try:
        parsed = parse_metrics(text, engine, now=1.0)
    except MetricsError:
        return
    m = parsed.metrics
    assert isinstance(m.waiting, int) and m.waiting >= 0
    assert isinstance(m.running, int) and m.running >= 0
    assert 0.0 <= m.kv_usage <= 1.0 and math.isfinite(m.kv_usage)
    assert m.block_size is None or m.block_size > 0
    assert m.num_gpu_blocks is None or m.num_gpu_blocks > 0


@fast(300)
@given(text=st.text(max_size=500), engine=st.sampled_from(list(DIALECTS)))
def test_arbitrary_text_as_metrics_page_never_raises_anything_but_metrics_error(
        text: str, engine: EngineType) -> None:
    with contextlib.suppress(MetricsError):
        parse_metrics(text, engine, now=1.0)


def test_huge_metric_values_are_clamped_not_fatal() -> None:
    page = "vllm:num_requests_waiting 1e308\nvllm:num_requests_waiting 1e308\n"
    parsed = parse_metrics(page, EngineType.VLLM, now=1.0)
    assert parsed.metrics.waiting > 0
    assert parsed.anomalies


def test_cache_config_label_too_big_for_an_int_is_ignored() -> None:
    page = 'vllm:num_requests_waiting 1\nvllm:cache_config_info{block_size="1e400"} 1\n'
    assert parse_metrics(page, EngineType.VLLM, now=1.0).metrics.block_size is None


# --- manifests ---------------------------------------------------------------------------------

API_VERSIONS = ["inference.networking.k8s.io/v1", "inference.networking.x-k8s.io/v1alpha2",
                "v1", "bogus/v9", 7, None]


@st.composite
def manifest_docs(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 5)) == 0:
        return draw(json_values)
    spec = draw(st.fixed_dictionaries({}, optional={
        "selector": json_values | st.just({"matchLabels": {"app": "x"}}),
        "targetPorts": json_values | st.just([{"number": 8000}, {"number": 8000}]),
        "targetPortNumber": json_values, "poolRef": json_values | st.just({"name": "p"}),
        "priority": json_values, "rules": json_values, "criticality": json_values,
        "targetModels": json_values, "modelName": json_values, "endpointPickerRef": json_values,
        "extensionRef": json_values, "appProtocol": json_values}))
    return {"apiVersion": draw(st.sampled_from(API_VERSIONS)),
            "kind": draw(st.sampled_from(sorted(KNOWN_KINDS)) | json_scalars),
            "metadata": draw(st.fixed_dictionaries({}, optional={
                "name": st.sampled_from(["p", ""]) | json_scalars,
                "namespace": json_scalars, "labels": json_values,
                "creationTimestamp": json_scalars, "annotations": json_values})),
            "spec": spec if draw(st.booleans()) else draw(json_values),
            "status": draw(json_values | st.just({"podIP": "10.0.0.1"}))}


@fast(1000)
@given(doc=manifest_docs())
def test_manifest_object_is_parsed_or_rejected_with_an_object_error(doc: Any) -> None:
    if not isinstance(doc, dict):
        return
    try:
        parse_object(doc)
    except ObjectError as e:
        assert e.obj and e.field and e.message


@fast(200)
@given(docs=st.lists(manifest_docs(), max_size=4), junk=st.text(max_size=80))
def test_manifest_file_is_loaded_or_rejected_with_a_manifest_error(docs: list[Any],
                                                                   junk: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.yaml"
        text = yaml.safe_dump_all(docs) if docs else junk
        path.write_text(text)
        try:
            parse_files([path])
        except ManifestError as e:
            assert str(path) in str(e)


def test_hostile_servicer_never_raises_for_bbr_in_either_mode() -> None:
    router = BodyRouter(build([], StaticBaseModels()))
    for mode in (BodyMode.BUFFERED, BodyMode.FULL_DUPLEX_STREAMED):
        servicer = ExtProcServicer(router.exchange, request_mode=mode, max_body=MAX_BODY)
        for body in (b"\xff", b"[" * 5000, b'{"model": 1}', b"x" * (MAX_BODY + 1)):
            msgs = [headers_msg([(":method", "POST"), (":path", "/v1/completions")])]
            status, _, _ = request_outcome(run_stream(servicer, msgs + body_msgs(body, [1])))
            assert status in (0, 400, 413)


@pytest.mark.parametrize("field", ["prompt", "extra"])
def test_body_nested_deeper_than_orjson_writes_gets_400_and_commits_nothing(field: str) -> None:
    d = director()
    deep = b"[" * 300 + b"]" * 300
    body = b'{"model":"base-model","prompt":"x","' + field.encode() + b'":' + deep + b"}"
    # "extra" only needs re-encoding when the model is rewritten.
    msgs = [headers_msg([(":method", "POST"), (":path", "/v1/completions"),
                         ("x-gateway-model-name-rewrite", "other-model")])]
    status, _, error = request_outcome(run_stream(
        picker_servicer(d, BodyMode.FULL_DUPLEX_STREAMED), msgs + body_msgs(body, [])))
    assert status == 400
    assert orjson.loads(error)["error"]["code"] == "invalid_body"
    assert all(v.inflight_requests == 0 for v in d.datastore.views())
