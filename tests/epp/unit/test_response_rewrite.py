"""The response's ``model`` is renamed back to the client's name in any valid JSON spelling,
in SSE streams cut anywhere and in whole bodies; usage is read in any spelling too."""

from __future__ import annotations

import json

import orjson
import pytest

from epp.requestcontrol.response import ResponseRewriter

CLIENT, TARGET = "food-review", "meta/food-review-v1"


def event(payload: dict, **dumps: object) -> bytes:
    return b"data: " + json.dumps(payload, **dumps).encode() + b"\n\n"  # type: ignore[arg-type]


def stream_through(rw: ResponseRewriter, data: bytes, cut_every: int) -> bytes:
    """Feed ``data`` in pieces of ``cut_every`` bytes, as Envoy might deliver it."""
    pieces = [data[i:i + cut_every] for i in range(0, len(data), cut_every)]
    out = b"".join(rw.chunk(p, False) for p in pieces[:-1])
    return out + rw.chunk(pieces[-1], True)


def models_in(sse: bytes) -> list[str]:
    return [orjson.loads(line[5:])["model"] for line in sse.split(b"\n")
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"]


PAYLOAD = {"id": "c1", "object": "chat.completion.chunk", "model": TARGET,
           "choices": [{"index": 0, "delta": {"content": "hi"}}]}
SPELLINGS = {
    "compact": {"separators": (",", ":")},
    "spaces": {},  # json.dumps default: '"model": "x"'
    "wide spaces": {"separators": (" ,  ", "  :   ")},
    "escaped slash and unicode": {"ensure_ascii": True},  # value spelled below
    "key order": {"sort_keys": True},
}


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("cut_every", [1, 7, 10_000])
def test_sse_model_renamed_in_any_spelling_and_any_cut(spelling: str, cut_every: int) -> None:
    data = event(PAYLOAD, **SPELLINGS[spelling]) * 3 + b"data: [DONE]\n\n"
    if spelling == "escaped slash and unicode":
        data = data.replace(b'"meta/food', b'"meta\\/f\\u006fod')
    rw = ResponseRewriter(CLIENT, TARGET)
    out = stream_through(rw, data, cut_every)
    assert models_in(out) == [CLIENT] * 3
    assert out.endswith(b"data: [DONE]\n\n")


def test_sse_keeps_the_servers_spacing_around_the_renamed_value() -> None:
    rw = ResponseRewriter(CLIENT, TARGET)
    out = rw.chunk(b'data: {"id": "c1",  "model" :  "meta/food-review-v1", "x": 1}\n\n', False)
    assert out == b'data: {"id": "c1",  "model" :  "food-review", "x": 1}\n\n'


def test_sse_text_that_looks_like_the_field_is_left_alone() -> None:
    content = f'say "model": "{TARGET}" please'
    payload = {"model": TARGET, "choices": [{"delta": {"content": content}}]}
    for dumps in ({}, {"separators": (",", ":")}):
        rw = ResponseRewriter(CLIENT, TARGET)
        out = orjson.loads(rw.chunk(event(payload, **dumps), False)[5:])
        assert out["model"] == CLIENT
        assert out["choices"][0]["delta"]["content"] == content


def test_sse_other_models_are_not_renamed() -> None:
    rw = ResponseRewriter(CLIENT, TARGET)
    for dumps in ({}, {"separators": (",", ":")}, {"ensure_ascii": True}):
        data = event({**PAYLOAD, "model": TARGET + "-other"}, **dumps)
        assert rw.chunk(data, False) == data


def test_sse_multi_line_event_is_renamed() -> None:
    pretty = json.dumps(PAYLOAD, indent=2).splitlines()
    data = b"".join(b"data: " + line.encode() + b"\n" for line in pretty) + b"\n"
    rw = ResponseRewriter(CLIENT, TARGET)
    out = stream_through(rw, data, 5)
    joined = b"\n".join(line[6:] for line in out.split(b"\n") if line.startswith(b"data: "))
    assert orjson.loads(joined)["model"] == CLIENT


def test_sse_crlf_lines_are_renamed() -> None:
    data = event(PAYLOAD).replace(b"\n", b"\r\n")
    out = stream_through(ResponseRewriter(CLIENT, TARGET), data, 3)
    assert orjson.loads(out.split(b"\r\n")[0][5:])["model"] == CLIENT


def test_same_model_both_ways_is_passed_through_untouched() -> None:
    rw = ResponseRewriter(TARGET, TARGET)
    data = event(PAYLOAD)
    assert rw.chunk(data, False) == data


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_sse_usage_read_in_any_spelling(spelling: str) -> None:
    final = {"model": TARGET, "choices": [],
             "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}}
    data = event(PAYLOAD, **SPELLINGS[spelling]) + event(final, **SPELLINGS[spelling])
    rw = ResponseRewriter(CLIENT, TARGET)
    stream_through(rw, data + b"data: [DONE]\n\n", 9)
    assert (rw.usage.prompt_tokens, rw.usage.completion_tokens) == (11, 5)


@pytest.mark.parametrize("dumps", [{}, {"indent": 2}, {"separators": (",", ":")},
                                   {"ensure_ascii": True, "sort_keys": True}])
def test_whole_body_renamed_in_any_spelling(dumps: dict) -> None:
    body = {"id": "c1", "object": "chat.completion", "model": TARGET,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    raw = json.dumps(body, **dumps).encode()
    if dumps.get("ensure_ascii"):
        raw = raw.replace(b'"meta/food', b'"meta\\/f\\u006fod')
    rw = ResponseRewriter(CLIENT, TARGET)
    out = orjson.loads(rw.body(raw))
    assert out == {**body, "model": CLIENT}
    assert (rw.usage.prompt_tokens, rw.usage.completion_tokens) == (4, 2)
