"""The metrics HTTP server: Prometheus text on ``/metrics`` plus routes a service adds
(e.g. the EPP's ``/debug/pool``), optionally behind a bearer token."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, Mapping

import structlog
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)

log = structlog.get_logger(__name__)

# No ``*_created`` series: upstream's Go client exports none, no dashboard reads them, and they
# double every counter's and histogram's series. prometheus_client checks this at scrape time,
# so metrics declared before this import are covered too.
disable_created_metrics()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def read_token(path: str | None) -> str | None:
    """The bearer token in ``path`` (stripped), or None without a path; OSError if unreadable
    or empty."""
    if not path:
        return None
    with open(path) as f:
        token = f.read().strip()
    if not token:
        raise OSError(f"{path} is empty")
    return token


def build_app(
    registry: CollectorRegistry = REGISTRY,
    routes: Mapping[str, Handler] | None = None,
    token: str | None = None,
) -> web.Application:
    """An aiohttp app serving ``/metrics`` (and ``routes``); with ``token`` every path needs
    ``Authorization: Bearer <token>`` (the scheme in any case, as RFC 7235 has it)."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if token is not None and not (scheme.lower() == "bearer" and hmac.compare_digest(
                given.strip().encode(), token.encode())):
            return web.Response(status=401, text="unauthorized\n")
        return await handler(request)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={
            "Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(middlewares=[auth] if token is not None else [])
    app.router.add_get("/metrics", metrics)
    for path, handler in (routes or {}).items():
        app.router.add_get(path, handler)
    return app


async def run_metrics_server(
    port: int,
    *,
    host: str = "0.0.0.0",
    registry: CollectorRegistry = REGISTRY,
    routes: Mapping[str, Handler] | None = None,
    token: str | None = None,
) -> None:
    """Serve until cancelled."""
    runner = web.AppRunner(build_app(registry, routes, token), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("serving metrics", port=port)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
