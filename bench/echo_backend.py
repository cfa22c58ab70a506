"""A model server that costs nearly nothing: answers every POST at once with a small
completion naming the requested model, and ``/metrics`` with an idle vLLM page. Used where a
benchmark measures the gateway, not the model.

    python -m bench.echo_backend --host 127.0.20.1 --host 127.0.20.2 --port 8000
"""

from __future__ import annotations

import argparse
import asyncio

import orjson
from aiohttp import web

METRICS = (
    'vllm:num_requests_waiting{model_name="m"} 0\n'
    'vllm:num_requests_running{model_name="m"} 0\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.1\n'
)


async def complete(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())
    return web.Response(body=orjson.dumps({
        "id": "x", "object": "chat.completion", "model": body.get("model", ""),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }), content_type="application/json")


async def metrics(_: web.Request) -> web.Response:
    return web.Response(text=METRICS)


async def serve(hosts: list[str], port: int) -> None:
    app = web.Application()
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
    args = p.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.host or ["127.0.0.1"], args.port))


if __name__ == "__main__":
    main()
