"""The simulator's Anthropic Messages, vLLM ``/inference/v1/generate`` and SGLang ``/generate``
endpoints over real HTTP, streamed and not, in the shapes those servers answer with (the
Messages ones read back by Anthropic's own client)."""

from __future__ import annotations

import anthropic
import httpx
import orjson
import pytest

from sim.fleet import Fleet
from tests.support.sim import MODEL

Server = tuple[Fleet, httpx.AsyncClient]


def data_lines(body: str) -> list[str]:
    return [line.removeprefix("data: ") for line in body.splitlines()
            if line.startswith("data: ")]


async def test_messages_with_anthropics_client_whole_and_streamed(server: Server) -> None:
    fleet, _ = server
    client = anthropic.AsyncAnthropic(base_url=fleet.urls[0], api_key="none", max_retries=0)
    msg = await client.messages.create(model=MODEL, max_tokens=5, system="brief",
                                       messages=[{"role": "user", "content": "abcd" * 8}])
    assert msg.type == "message" and msg.model == MODEL and msg.stop_reason == "max_tokens"
    assert msg.content[0].type == "text" and msg.usage.output_tokens == 5
    assert msg.usage.input_tokens > 8
    async with client.messages.stream(model=MODEL, max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert final.usage.output_tokens == 4 and text == final.content[0].text and text
    count = await client.messages.count_tokens(model=MODEL, messages=[
        {"role": "user", "content": "abcd" * 8}])
    assert count.input_tokens > 8
    await client.close()


async def test_messages_stream_event_order(server: Server) -> None:
    _, client = server
    r = await client.post("/v1/messages", json={
        "model": MODEL, "max_tokens": 2, "stream": True,
        "messages": [{"role": "user", "content": "x"}]})
    kinds = [orjson.loads(d)["type"] for d in data_lines(r.text)]
    assert kinds == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]


@pytest.mark.parametrize("body", [b"{", b'{"model": "m"}', b'{"messages": [], "max_tokens": 1}'])
async def test_messages_bad_bodies_answer_anthropics_400(server: Server, body: bytes) -> None:
    _, client = server
    r = await client.post("/v1/messages", content=body)
    assert r.status_code == 400
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"


async def test_vllm_generate_returns_token_ids_whole_and_streamed(server: Server) -> None:
    _, client = server
    body = {"token_ids": [1, 2, 3, 4], "sampling_params": {"max_tokens": 3},
            "request_id": "rq-1"}
    r = await client.post("/inference/v1/generate", json=body)
    got = r.json()
    assert r.status_code == 200 and got["request_id"] == "rq-1"
    assert len(got["choices"][0]["token_ids"]) == 3 and "usage" not in got
    r = await client.post("/inference/v1/generate", json={
        **body, "model": MODEL, "stream": True, "stream_options": {"include_usage": True}})
    lines = data_lines(r.text)
    assert lines[-1] == "[DONE]"
    chunks = [orjson.loads(x) for x in lines[:-1]]
    assert [len(c["choices"][0]["token_ids"]) for c in chunks[:-1]] == [1, 1, 1]
    assert chunks[-1]["usage"]["prompt_tokens"] == 4
    assert chunks[-1]["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("body", [{"token_ids": [], "sampling_params": {}},
                                  {"token_ids": [1]}, {"token_ids": ["a"], "sampling_params": {}}])
async def test_vllm_generate_bad_bodies_are_400(server: Server, body: dict) -> None:
    _, client = server
    r = await client.post("/inference/v1/generate", json=body)
    assert r.status_code == 400 and "error" in r.json()


async def test_sglang_generate_text_and_ids_whole_and_streamed(server: Server) -> None:
    _, client = server
    r = await client.post("/generate", json={"text": "abcd" * 5,
                                             "sampling_params": {"max_new_tokens": 3}})
    got = r.json()
    assert got["meta_info"]["completion_tokens"] == 3
    assert got["meta_info"]["prompt_tokens"] == 5
    assert got["meta_info"]["finish_reason"]["type"] == "length"
    r = await client.post("/generate", json={"input_ids": [5, 6], "stream": True,
                                             "sampling_params": {"max_new_tokens": 2}})
    lines = data_lines(r.text)
    assert lines[-1] == "[DONE]"
    last = orjson.loads(lines[-2])
    assert last["meta_info"]["prompt_tokens"] == 2 and last["meta_info"]["completion_tokens"] == 2
    assert last["text"].startswith(orjson.loads(lines[0])["text"])
    bad = await client.post("/generate", json={"sampling_params": {}})
    assert bad.status_code == 400
