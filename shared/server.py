"""gRPC server bootstrap shared by BBR and EPP.

One ``grpc.aio`` server for ext_proc (TLS by default), a plaintext one for the standard gRPC
health service on its own port (what kubelet's grpc probes call), the metrics HTTP server, and
a graceful drain on SIGTERM/SIGINT: health turns NOT_SERVING, new streams are refused, and
in-flight ones get ``grace`` seconds to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import structlog
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from shared.tls import server_credentials

log = structlog.get_logger(__name__)

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


#: The largest single body chunk Envoy may send in FULL_DUPLEX_STREAMED: when the ext_proc
#: stream is behind, Envoy sends what it holds at once, up to the listener's buffer limit
#: (32 MiB in the local stack), whatever the body cap. A gRPC message limit of only "cap +
#: 1 MiB" failed such a stream (Envoy: a bare 500 instead of the 413; issue 31). gRPC holds a
#: message only as big as what arrives, so the larger limit costs nothing until used.
STREAM_CHUNK_LIMIT = 64 * 1024 * 1024


def message_limit(max_body: int) -> int:
    """The gRPC message limit for a service whose body cap is ``max_body``: a BUFFERED body
    is one message (and may go back as one), a streamed chunk may reach
    :data:`STREAM_CHUNK_LIMIT`; 1 MiB on top for the rest of the message."""
    return max(max_body, STREAM_CHUNK_LIMIT) + 1024 * 1024


@dataclass(slots=True)
class ServeOptions:
    """Ports and transport security for a service."""

    grpc_port: int
    health_port: int
    secure: bool = True
    cert_path: str | None = None
    #: PEM file of the CA that signs client certificates; set: mTLS on the ext_proc port
    client_ca: str | None = None
    host: str = "0.0.0.0"
    grace: float = 30.0
    max_message_bytes: int = 16 * 1024 * 1024
    """gRPC message cap; a BUFFERED body arrives (and may go back) as one message, so this
    must exceed the body cap."""
    max_receive_bytes: int | None = None
    """``--grpc-max-recv-msg-size``: overrides ``max_message_bytes`` for received messages."""
    max_send_bytes: int | None = None
    """``--grpc-max-send-msg-size``: overrides ``max_message_bytes`` for sent messages."""
    drain: float = 0.0
    """``--drain-timeout``: after SIGTERM, health says NOT_SERVING (and the Lease goes) at
    once but ext_proc keeps taking new streams this long, for proxies that still route here
    until they notice; then new streams are refused and in-flight ones get ``grace``."""
    health_on_grpc_port: bool = False
    """Also serve the health service on the ext_proc port (upstream's ``--health-checking``)."""


#: Streams gRPC core may hold for the ext_proc server between their arrival and the moment
#: ``grpc.aio``'s loop takes them up. Core's defaults (1,000, dropping at random up to 3,000,
#: then refusing every new stream) cancelled ~10-25% of a burst of 10,000 streams the EPP
#: would otherwise have queued (``python -m bench.micro rss --queued 10000``); Go's gRPC
#: server, which upstream runs, has no such backlog. Admission is flow control's job (its
#: queue limits answer 429), so the backlog is set far above any queue a pool is configured
#: for. A stream still waits at most gRPC's 30 s before core drops it.
PENDING_STREAMS_SOFT, PENDING_STREAMS_HARD = 50_000, 100_000


#: Health service names that mean "ready for traffic": the server as a whole (``""``), the
#: ext_proc service, upstream's ``readiness`` (probed with leader election) and
#: ``inference-extension`` (upstream's inferencepool chart probes it with one replica).
READINESS_SERVICES = ("", EXT_PROC_SERVICE, "readiness", "inference-extension")
#: Upstream's liveness name: SERVING while the process answers, so kubelet never restarts
#: a stand-by replica (not leader, hence not ready) or a draining one.
LIVENESS_SERVICE = "liveness"


class Health:
    """The gRPC health service; a service flips it to SERVING when it can take traffic.

    Names in :data:`READINESS_SERVICES` follow :meth:`set_serving`; :data:`LIVENESS_SERVICE`
    is always SERVING; any other name is answered with gRPC status NOT_FOUND.
    """

    def __init__(self) -> None:
        self.servicer = HealthServicer()
        self.serving = False

    async def start(self) -> None:
        """Register every name: readiness ones NOT_SERVING, liveness SERVING."""
        await self.servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await self.set_serving(self.serving)

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING (or NOT_SERVING) for every readiness name."""
        self.serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in READINESS_SERVICES:
            await self.servicer.set(name, status)


def install_uvloop() -> None:
    """Use uvloop when installed (measured +16% throughput here)."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(
    servicer: pb_grpc.ExternalProcessorServicer,
    opts: ServeOptions,
    *,
    health: Health | None = None,
    ready: Callable[[Health], Awaitable[None]] | None = None,
    background: list[Awaitable[None]] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set), then drain and return.

    ``ready`` decides when health says SERVING (default: at once); ``background`` tasks
    (metrics server, scrapers, watchers) are cancelled at shutdown.
    """
    health = health or Health()
    server = grpc.aio.server(options=[
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", opts.max_receive_bytes or opts.max_message_bytes),
        ("grpc.max_send_message_length", opts.max_send_bytes or opts.max_message_bytes),
        ("grpc.server.max_pending_requests", PENDING_STREAMS_SOFT),
        ("grpc.server.max_pending_requests_hard_limit", PENDING_STREAMS_HARD),
    ])
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    if opts.health_on_grpc_port:
        health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    address = f"{opts.host}:{opts.grpc_port}"
    if opts.secure:
        server.add_secure_port(address, server_credentials(opts.cert_path, opts.client_ca))
    else:
        server.add_insecure_port(address)
    health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, health_server)
    health_server.add_insecure_port(f"{opts.host}:{opts.health_port}")

    await health.start()
    await server.start()
    await health_server.start()
    # What start-up built (config, plugins, protobuf descriptors) lives as long as the process:
    # frozen, a full collection walks only what the requests made (measured: a third of the
    # full collections' CPU, more with tracing's spans waiting for their batch).
    gc.collect()
    gc.freeze()
    log.info("serving ext_proc", address=address, tls=opts.secure, health_port=opts.health_port)

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    tasks = [asyncio.ensure_future(t) for t in (background or [])]
    if ready is None:
        await health.set_serving(True)
    else:
        tasks.append(asyncio.ensure_future(ready(health)))
    try:
        await stop.wait()
    finally:
        log.info("draining", grace_seconds=opts.grace, drain_timeout_seconds=opts.drain)
        await health.set_serving(False)
        if opts.drain > 0:
            # Still serving ext_proc: a proxy that has not yet seen NOT_SERVING (or a DNS
            # refresh) keeps sending streams here, and they are answered, not refused.
            await asyncio.sleep(opts.drain)
        await server.stop(opts.grace)
        await health_server.stop(0)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        log.info("stopped")
