"""``token-producer`` against a simulated vLLM's ``/render`` endpoints: completions and chat
(the server's chat template applied) get the ids the server's KV events carry; a server that
is down or answers badly leaves the request without ids and says so."""

from __future__ import annotations

import orjson
from aiohttp import web

from devkit import envoy as e
from epp.requestcontrol.plugins.token_producer import (
    TokenProducer,
    TokenProducerParameters,
    VllmBackend,
)
from epp.scheduling.request import LLMRequest, prefix_input
from sim import start_fleet
from sim.tokenizer import apply_chat_template, token_ids
from tests.support.sim import tiny

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def producer(url: str) -> TokenProducer:
    return TokenProducer("token-producer", TokenProducerParameters(
        model_name=MODEL, vllm=VllmBackend(http=url)))


def request(path: str, prompt: bytes) -> LLMRequest:
    return LLMRequest("r1", MODEL, prompt=prompt, headers={":path": path})


async def test_completion_and_chat_prompts_get_the_servers_token_ids() -> None:
    async with start_fleet([tiny(model=MODEL)]) as fleet:
        tp = producer(fleet.urls[0])
        text = "The quick brown fox jumps over the lazy dog. " * 5
        req = request("/v1/completions", prefix_input(text))
        await tp.admit(req, [])
        assert req.prompt_token_ids == token_ids(text.encode())
        assert req.prompt_tokens == len(req.prompt_token_ids)

        messages = [{"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hello there"}]
        chat = request("/v1/chat/completions", prefix_input(None, messages))
        await tp.admit(chat, [])
        assert chat.prompt_token_ids == token_ids(apply_chat_template(messages).encode())

        already = request("/v1/completions", b"abcd")
        already.prompt_token_ids = [7]
        assert tp.admit(already, []) is None  # an earlier producer's ids are kept
        assert already.prompt_token_ids == [7]
        await tp.aclose()


async def test_unreachable_or_bad_server_leaves_no_ids() -> None:
    tp = producer(f"http://127.0.0.1:{e.free_port()}")  # nothing listens
    req = request("/v1/completions", b"hello world, hello world")
    await tp.admit(req, [])
    assert req.prompt_token_ids is None and tp.failures == 1
    await tp.aclose()

    async def bad(_: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps([{"token_ids": ["not", "ids"]}]))

    app = web.Application()
    app.router.add_post("/v1/completions/render", bad)
    runner = web.AppRunner(app)
    await runner.setup()
    port = e.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        tp2 = producer(f"http://127.0.0.1:{port}")
        req2 = request("/v1/completions", b"hello world, hello world")
        await tp2.admit(req2, [])
        assert req2.prompt_token_ids is None and tp2.failures == 1
        await tp2.aclose()
    finally:
        await runner.cleanup()


async def test_render_endpoints_of_the_simulator_answer_as_vllm() -> None:
    import aiohttp

    async with start_fleet([tiny(model=MODEL)]) as fleet, aiohttp.ClientSession() as c:
        url = fleet.urls[0]
        async with c.post(f"{url}/v1/completions/render",
                          json={"model": MODEL, "prompt": ["abcd", "efgh1234"]}) as r:
            assert await r.json() == [{"token_ids": token_ids(b"abcd")},
                                      {"token_ids": token_ids(b"efgh1234")}]
        messages = [{"role": "user", "content": "hi"}]
        async with c.post(f"{url}/v1/chat/completions/render",
                          json={"model": MODEL, "messages": messages}) as r:
            want = token_ids(apply_chat_template(messages).encode())
            assert (await r.json())["token_ids"] == want
        async with c.post(f"{url}/v1/chat/completions/render", json={"model": MODEL}) as r:
            assert r.status == 400
        async with c.post(f"{url}/v1/completions/render",
                          json={"model": "nope", "prompt": "x"}) as r:
            assert r.status == 404


def test_estimate_backend_packs_prompt_bytes_without_a_server() -> None:
    from epp.config.builtins import builtin_registry
    from epp.requestcontrol.plugins.token_producer import pack_bytes

    tp = builtin_registry().create("token-producer", "", {})
    assert tp.params.backend == "estimate"
    req = request("/v1/completions", b"abcdefgh12")
    assert tp.admit(req, []) is None  # no awaiting: nothing is asked
    assert req.prompt_token_ids == pack_bytes(b"abcdefgh12") == [
        int.from_bytes(b"abcd", "little"), int.from_bytes(b"efgh", "little"),
        int.from_bytes(b"12\0\0", "little")]
    assert req.prompt_tokens == 3
    assert builtin_registry().create("token-producer", "", {"modelName": MODEL}).params.backend \
        == "vllm"
