"""The gRPC health service of :func:`shared.server.serve`: which names answer what, and when.

Upstream's charts probe ``inference-extension`` (one replica), ``readiness`` and ``liveness``
(leader election); Envoy and load balancers ask ``""`` or the ext_proc service.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devkit import envoy as e
from shared.server import (
    EXT_PROC_SERVICE,
            Health,
    ServeOptions,
    serve,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def check(port: int, service: str) -> int | grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        try:
            resp = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5)
        except grpc.aio.AioRpcError as err:
            return err.code()
    return int(resp.status)


async def wait_up(port: int) -> None:
    """Until the health server answers (UNAVAILABLE while it is not listening yet)."""
    for _ in range(200):
        if await check(port, "liveness") == SERVING:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("health server never answered")


#: Upstream's readiness names (written out: the test must not trust the constant).
READY_NAMES = ("", EXT_PROC_SERVICE, "readiness", "inference-extension")


@pytest.mark.asyncio
async def test_readiness_names_follow_ready_liveness_always_serves_others_not_found() -> None:
    opts = ServeOptions(grpc_port=e.free_port(), health_port=e.free_port(), secure=False,
                        grace=0)
    go = asyncio.Event()
    stop = asyncio.Event()

    async def ready(health: Health) -> None:
        await go.wait()
        await health.set_serving(True)

    task = asyncio.create_task(serve(pb_grpc.ExternalProcessorServicer(), opts,
                                     ready=ready, stop=stop))
    try:
        await wait_up(opts.health_port)
        assert await check(opts.health_port, "liveness") == SERVING
        for name in READY_NAMES:
            assert await check(opts.health_port, name) == NOT_SERVING, name
        assert await check(opts.health_port, "bogus") == grpc.StatusCode.NOT_FOUND
        go.set()
        for _ in range(100):
            if await check(opts.health_port, "inference-extension") == SERVING:
                break
            await asyncio.sleep(0.02)
        for name in READY_NAMES:
            assert await check(opts.health_port, name) == SERVING, name
        assert await check(opts.health_port, "liveness") == SERVING
        assert await check(opts.health_port, "bogus") == grpc.StatusCode.NOT_FOUND
    finally:
        stop.set()
        await task


@pytest.mark.asyncio
async def test_not_serving_again_keeps_liveness() -> None:
    """A leader that loses the Lease is no longer ready, but must not be restarted."""
    health = Health()
    await health.start()
    await health.set_serving(True)
    await health.set_serving(False)
    opts = ServeOptions(grpc_port=e.free_port(), health_port=e.free_port(), secure=False,
                        grace=0)
    stop = asyncio.Event()

    async def never(_: Health) -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(serve(pb_grpc.ExternalProcessorServicer(), opts, health=health,
                                     ready=never, stop=stop))
    try:
        await wait_up(opts.health_port)
        assert await check(opts.health_port, "readiness") == NOT_SERVING
        assert await check(opts.health_port, "liveness") == SERVING
    finally:
        stop.set()
        await task
