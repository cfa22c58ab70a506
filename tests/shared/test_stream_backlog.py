"""A burst of ext_proc streams larger than gRPC core's default backlog reaches the servicer.

gRPC core holds streams that arrived before ``grpc.aio``'s loop took them up; by default it
starts dropping them at 1,000 and refuses all past 3,000. The EPP queues requests in flow
control, so a burst of that size must reach it (:data:`shared.server.PENDING_STREAMS_SOFT`).

The server runs in its own process (``SERVER`` below, on :func:`shared.server.serve`): its
first stream's handler blocks the event loop until the test writes a line to its stdin, so
every stream the test opens meanwhile waits in core's backlog — deterministically, not by
racing a busy loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from devkit import envoy as e

#: Twice core's default hard limit: with the defaults at least 3,000 of these are refused.
BURST = 6_000

SERVER = """
import asyncio, sys
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from shared.server import ServeOptions, serve

class Blocking(pb_grpc.ExternalProcessorServicer):
    first = True

    async def Process(self, requests, context):
        async for _ in requests:
            if Blocking.first:
                Blocking.first = False
                print("blocked", flush=True)
                sys.stdin.readline()  # blocks the loop: later streams wait in core's backlog
            yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            return

port, health = int(sys.argv[1]), int(sys.argv[2])
asyncio.run(serve(Blocking(), ServeOptions(grpc_port=port, health_port=health, secure=False,
                                           grace=0)))
"""


def headers() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(end_of_stream=True))


async def one_stream(stub: pb_grpc.ExternalProcessorStub) -> grpc.aio.StreamStreamCall:
    call = stub.Process()
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
        await call.write(headers())  # a refused stream may fail here; answer() sees it
    return call


async def answer(call: grpc.aio.StreamStreamCall) -> bool:
    try:
        resp = await call.read()
    except grpc.aio.AioRpcError:
        return False
    return resp is not grpc.aio.EOF and resp.HasField("request_headers")


@pytest.mark.asyncio
async def test_a_burst_past_cores_default_backlog_reaches_the_servicer() -> None:
    port, health = e.free_port(), e.free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(health)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            await asyncio.wait_for(ch.channel_ready(), 20)
            stub = pb_grpc.ExternalProcessorStub(ch)
            first = await one_stream(stub)
            while (line := await asyncio.to_thread(proc.stdout.readline)) != "blocked\n":
                assert line, "the server exited"  # its log lines come first
            calls = [await one_stream(stub) for _ in range(BURST)]
            proc.stdin.write("go\n")
            proc.stdin.flush()
            answered = await asyncio.gather(*(answer(c) for c in [first, *calls]))
        assert sum(answered) == BURST + 1
    finally:
        proc.kill()
        proc.wait()
