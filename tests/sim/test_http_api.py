"""OpenAI API over real HTTP: shapes, streaming, usage, errors, headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from sim.fleet import Fleet
from tests.support.sim import MODEL, FleetFactory, tiny

Server = tuple[Fleet, httpx.AsyncClient]


def sse_events(body: str) -> list[str]:
    return [line.removeprefix("data: ") for line in body.split("\n\n") if line]


async def test_completion_returns_max_tokens_and_usage(server: Server) -> None:
    _, client = server
    r = await client.post("/v1/completions",
                          json={"model": MODEL, "prompt": "abcd" * 10, "max_tokens": 7})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["text"]) == 7 * 4
    assert body["usage"]["prompt_tokens"] == 10
    assert body["usage"]["completion_tokens"] == 7
    assert body["usage"]["total_tokens"] == 17


async def test_chat_stream_sends_role_then_one_chunk_per_token_then_usage_and_done(
    server: Server,
) -> None:
    _, client = server
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
        "stream": True, "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = chunks[1:-1]
    assert len(tokens) == 5
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 4 + ["length"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert len({c["id"] for c in chunks}) == 1


async def test_completion_stream_without_usage_option_has_no_usage_chunk(server: Server) -> None:
    _, client = server
    r = await client.post("/v1/completions", json={
        "model": MODEL, "prompt": "hello", "max_tokens": 3, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert all("usage" not in orjson.loads(e) for e in events[:-1])
    assert "".join(orjson.loads(e)["choices"][0]["text"] for e in events[:-1]) != ""
    assert len(events) == 4


async def test_non_stream_text_equals_concatenated_stream_text(server: Server) -> None:
    _, client = server
    full = (await client.post("/v1/completions", json={
        "prompt": "x", "max_tokens": 6})).json()["choices"][0]["text"]
    r = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 6,
                                                   "stream": True})
    streamed = "".join(orjson.loads(e)["choices"][0]["text"] for e in sse_events(r.text)[:-1])
    assert len(streamed) == len(full) == 24


async def test_chunked_request_body_is_accepted(server: Server) -> None:
    _, client = server
    payload = orjson.dumps({"model": MODEL, "prompt": "chunked " * 50, "max_tokens": 2})

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 37):
            yield payload[i : i + 37]

    r = await client.post("/v1/completions", content=pieces(),
                          headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == 100


async def test_chat_max_completion_tokens_bounds_output(server: Server) -> None:
    _, client = server
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "x"}],
        "max_completion_tokens": 3, "max_tokens": 9})
    assert r.json()["usage"]["completion_tokens"] == 3
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", b'{"model": "m"}'),
    ("/v1/chat/completions", b'{"messages": []}'),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}'),
    ("/v1/completions", b'{"prompt": "x", "stream_options": {"include_usage": true}}'),
])
async def test_bad_request_is_400_with_openai_error(server: Server, path: str,
                                                    body: bytes) -> None:
    _, client = server
    r = await client.post(path, content=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400 and err["message"]


async def test_prompt_beyond_max_model_len_is_400(server: Server) -> None:
    _, client = server
    r = await client.post("/v1/completions", json={"prompt": "abcd" * 4000, "max_tokens": 200})
    assert r.status_code == 400
    assert "maximum context length" in r.json()["error"]["message"]


async def test_unknown_model_is_404(server: Server) -> None:
    _, client = server
    r = await client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "NotFoundError"


async def test_full_waiting_queue_is_429(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(max_num_seqs=1, max_waiting=1, time_scale=5.0)) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        engine = fleet.servers[0].engine
        slow = []
        for running, waiting in ((1, 0), (1, 1)):
            slow.append(asyncio.create_task(client.post(
                "/v1/completions", json={"prompt": "x", "max_tokens": 50})))
            for _ in range(200):
                if (engine.num_running, engine.num_waiting) == (running, waiting):
                    break
                await asyncio.sleep(0.005)
        r = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 429
        assert r.json()["error"]["code"] == 429
        for t in slow:
            t.cancel()
        await asyncio.gather(*slow, return_exceptions=True)


async def test_every_response_names_pod_and_port(server: Server) -> None:
    fleet, client = server
    port = str(fleet.ports[0])
    responses = [
        await client.get("/health"),
        await client.get("/metrics"),
        await client.get("/no/such/path"),
        await client.post("/v1/completions", content=b"{"),
        await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}),
    ]
    for r in responses:
        assert r.headers["x-inference-port"] == port
        assert r.headers["x-inference-pod"] == f"sim-{port}"


async def test_pod_name_is_configurable(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(name="pod-a")) as fleet:
        async with httpx.AsyncClient() as client:
            r = await client.get(fleet.urls[0] + "/health")
        assert r.headers["x-inference-pod"] == "pod-a"


async def test_models_lists_base_and_adapters_and_tracks_load_unload(
    fleet_of: FleetFactory,
) -> None:
    async with fleet_of(tiny(served_model_names=["base", "alias"],
                             lora_modules={"sql": "/a/sql"})) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0]) as client:
        ids = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        assert ids == ["base", "alias", "sql"]
        r = await client.post("/v1/load_lora_adapter",
                              json={"lora_name": "chat", "lora_path": "/a/chat"})
        assert r.status_code == 200 and "added" in r.text
        again = await client.post("/v1/load_lora_adapter",
                                  json={"lora_name": "chat", "lora_path": "/a/chat"})
        assert again.status_code == 400
        ok = await client.post("/v1/completions", json={"model": "chat", "prompt": "x",
                                                        "max_tokens": 1})
        assert ok.status_code == 200
        assert (await client.post("/v1/unload_lora_adapter",
                                  json={"lora_name": "sql"})).status_code == 200
        missing = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
        assert missing.status_code == 404
        ids = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        assert ids == ["base", "alias", "chat"]
        gone = await client.post("/v1/completions", json={"model": "sql", "prompt": "x"})
        assert gone.status_code == 404


async def test_client_disconnect_aborts_engine_request(fleet_of: FleetFactory) -> None:
    async with fleet_of(tiny(time_scale=5.0)) as fleet:
        engine = fleet.servers[0].engine
        async with httpx.AsyncClient(base_url=fleet.urls[0]) as client:
            task = asyncio.create_task(client.post(
                "/v1/completions", json={"prompt": "x", "max_tokens": 500}))
            for _ in range(200):
                if engine.num_running:
                    break
                await asyncio.sleep(0.005)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for _ in range(200):
            if not engine.num_running:
                break
            await asyncio.sleep(0.005)
        assert engine.num_running == 0 and engine.kv.usage == 0


async def test_peer_router_endpoints_report_model_and_load(server: Server) -> None:
    _, client = server
    load = (await client.get("/get_load")).json()
    assert load["load"] == 0 and load["num_waiting_reqs"] == 0
    assert (await client.get("/get_model_info")).json()["model_path"] == MODEL
    assert (await client.get("/model_info")).json()["is_generation"] is True
    info = (await client.get("/server_info")).json()
    assert info["max_num_seqs"] == 4 and info["page_size"] == 16
    assert (await client.get("/get_server_info")).json() == info
