"""A model server that costs nearly nothing: answers every POST at once with a small
completion naming the requested model, and ``/metrics`` with an idle vLLM page (a full one
with ``--saturated``). Used where a
benchmark measures the gateway, not the model.

A request with ``"stream": true`` gets ``max_tokens`` SSE events, one token each, written
``--token-gap-ms`` apart (as a model server sends them, so each is its own read for Envoy),
then a usage event and ``[DONE]``.

    python -m bench.echo_backend --host 127.0.20.1 --host 127.0.20.2 --port 8000
"""

from __future__ import annotations

import argparse
import asyncio

import orjson
from aiohttp import web

from shared.server import install_uvloop

METRICS = (
    'vllm:num_requests_waiting{model_name="m"} 0\n'
    'vllm:num_requests_running{model_name="m"} 0\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.1\n'
)
#: ``--saturated``: a pool whose every server is full, so flow control queues everything.
SATURATED = (
    'vllm:num_requests_waiting{model_name="m"} 100\n'
    'vllm:num_requests_running{model_name="m"} 8\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.9\n'
)


async def complete(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    if body.get("stream"):
        return await stream(request, body)
    return web.Response(body=orjson.dumps({
        "id": "x", "object": "chat.completion", "model": body.get("model", ""),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }), content_type="application/json")


async def stream(request: web.Request, body: dict[str, object]) -> web.StreamResponse:
    tokens = int(body.get("max_tokens") or 16)  # type: ignore[call-overload]
    gap = request.app["token_gap"]
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    head = b'data: {"id":"x","object":"chat.completion.chunk","model":' + orjson.dumps(
        body.get("model", ""))
    event = head + b',"choices":[{"index":0,"delta":{"content":"ok"}}]}\n\n'
    for _ in range(tokens):
        await resp.write(event)
        await asyncio.sleep(gap)
    await resp.write(head + b',"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":'
                     + str(tokens).encode() + b'}}\n\ndata: [DONE]\n\n')
    await resp.write_eof()
    return resp


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=request.app["metrics"])


async def serve(hosts: list[str], port: int, token_gap: float, page: str = METRICS) -> None:
    app = web.Application()
    app["token_gap"], app["metrics"] = token_gap, page
    app.router.add_post("/{tail:.*}", complete)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for host in hosts:
        await web.TCPSite(runner, host, port).start()
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", action="append", default=[])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--token-gap-ms", type=float, default=2.0,
                   help="pause between streamed tokens (default 2)")
    p.add_argument("--saturated", action="store_true",
                   help="/metrics says the server is full (100 waiting, KV cache 90%%)")
    args = p.parse_args()
    install_uvloop()
    asyncio.run(serve(args.host or ["127.0.0.1"], args.port, args.token_gap_ms / 1e3,
                      SATURATED if args.saturated else METRICS))


if __name__ == "__main__":
    main()
