"""Resident memory each request leaves behind in BBR and the EPP, through the real gateway
(Envoy → BBR → EPP → ``vllm-sim``, 4 pods), with Envoy's default ext_proc stream close (a
half-close then an immediate reset) and with graceful close (``devkit.envoy.GRACEFUL_CLOSE``:
Envoy half-closes and waits for the service's status).

    python -m bench.rss_per_request [--seconds 60] [--concurrency 32]
    python -m bench.rss_per_request --queued 10000 [--body-bytes 3200]

grpc.aio leaks the native memory of a batch that a stream reset fails or cancels
(grpc/grpc#43360); the services end their streams themselves to stay out of that race
(``shared/extproc.py``), and graceful close removes it. The figure is RSS growth over the
measured run divided by its requests, after a warm-up run of a quarter of its length. The
graceful-close run is the baseline; each run starts fresh processes.

``--queued N`` (issue #14's "10,000 queued"): a running ``epp`` process (flow control on, its
one endpoint a small HTTP server whose metrics say the pool is saturated, so everything
waits) gets N ext_proc streams straight from this process (gRPC, as Envoy would send them;
Envoy's default circuit breaker allows 1,024 concurrent streams to one cluster, so a single
default Envoy could not queue this many), all opened at once. Its RSS (``/proc``) is read
before, with all N queued, and after they are cancelled; then a second round of N shows
whether the memory freed by the first is reused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.harness import load
from devkit.envoy import GRACEFUL_CLOSE
from devkit.reliability.faultkit import MODEL, SimFleet, start_sim_gateway
from devkit.reliability.gateway import rss_kb


def measure(runtime: dict[str, Any] | None, seconds: float, concurrency: int
            ) -> dict[str, Any]:
    """Bytes of RSS per request for each service, and the run's request and error counts."""
    workdir = Path(tempfile.mkdtemp(prefix="rss-per-request-"))
    body = workdir / "body.json"
    body.write_bytes(orjson.dumps({"model": MODEL, "max_tokens": 2, "prompt": "leak probe"}))
    fleet = SimFleet(4, workdir).start()
    gw = start_sim_gateway(workdir, fleet, runtime=runtime)
    procs = {"bbr": gw.bbr.proc, "epp": gw.epps["sim"].proc}
    pids = {name: proc.pid for name, proc in procs.items() if proc is not None}
    try:
        load(gw.url(), body, concurrency, seconds / 4)
        before = {name: rss_kb(pid) for name, pid in pids.items()}
        stats = load(gw.url(), body, concurrency, seconds)
        after = {name: rss_kb(pid) for name, pid in pids.items()}
    finally:
        gw.stop()
        fleet.stop()
    n = max(1, stats["requests"])
    return {"requests": stats["requests"], "errors": stats["errors"],
            **{name: (after[name] - before[name]) * 1024 / n for name in pids}}


SATURATED_METRICS = (b"vllm:num_requests_waiting{model_name=\"m\"} 100\n"
                     b"vllm:num_requests_running{model_name=\"m\"} 8\n"
                     b"vllm:kv_cache_usage_perc{model_name=\"m\"} 0.9\n")


async def _metrics_server() -> tuple[asyncio.AbstractServer, int]:
    """A tiny real HTTP server answering every GET with saturated vLLM metrics."""
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        # CancelledError: the server closes with the loop at the end
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError,
                                 asyncio.CancelledError):
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                if not head:
                    break
                w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: "
                        + str(len(SATURATED_METRICS)).encode() + b"\r\n\r\n"
                        + SATURATED_METRICS)
                await w.drain()
        w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def queued_rss(n: int, body_bytes: int, workdir: Path) -> dict[str, Any]:
    """The EPP's RSS before, with ``n`` ext_proc streams queued by flow control (its one
    endpoint reports saturation, so all wait), and after they are cancelled; twice, so the
    second round shows whether the memory freed by the first is reused."""
    import grpc
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    from devkit.manifests import pool_manifests, write_yaml
    from devkit.reliability.gateway import ServiceProcess

    server, port = await _metrics_server()
    workdir.mkdir(parents=True, exist_ok=True)
    manifests = workdir / "pool.yaml"
    write_yaml(manifests, pool_manifests("pool", [("pod-0", "127.0.0.1")], port))
    config = (f"featureGates: [flowControl]\nflowControl: {{maxRequests: {n * 2}}}\n")
    epp = ServiceProcess("epp.main", "--manifests", str(manifests), "--secure-serving=false",
                         "--config-text", config, log_path=workdir / "epp.log").start()
    try:
        await asyncio.to_thread(epp.wait_serving)
        assert epp.proc is not None
        pid = epp.proc.pid

        async def queued() -> int:
            status, body = await asyncio.to_thread(epp.get, "/debug/pool")
            return int(orjson.loads(body).get("flowControl", {}).get("queued", -1)) \
                if status == 200 else -1

        prompt = ("abc " * (body_bytes // 4))[:body_bytes]
        payload = orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 16})
        # 20 connections (no shared subchannel), as several Envoys would open. All 10,000
        # streams are opened at once: before shared.server raised gRPC core's backlog of
        # streams not yet taken up by the server's loop (PENDING_STREAMS_SOFT), core
        # cancelled 10-25% of them and the queue stopped at 6-9k.
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{epp.port}",
                                              options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(20)]

        def messages(i: int) -> list[Any]:
            hdrs = [(":method", "POST"), (":path", "/v1/completions"),
                    ("content-type", "application/json"), ("x-request-id", f"q{i}")]
            return [pb.ProcessingRequest(request_headers=pb.HttpHeaders(
                        headers=base_pb2.HeaderMap(headers=[
                            base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs]))),
                    pb.ProcessingRequest(request_body=pb.HttpBody(body=payload,
                                                                  end_of_stream=True))]

        await asyncio.sleep(1.0)
        before = rss_kb(pid)
        rounds = []
        for r in range(2):  # the second round shows whether freed memory is reused
            calls = []
            for i in range(n):
                stub = pb_grpc.ExternalProcessorStub(channels[i % len(channels)])
                calls.append(stub.Process(iter(messages(r * n + i))))
                if i % 500 == 499:
                    await asyncio.sleep(0)
            deadline = time.monotonic() + 300
            while (q := await queued()) < n and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(2.0)
            with_queue = rss_kb(pid)
            failed = sum(1 for c in calls if c.done())  # ended while all should wait
            for c in calls:
                c.cancel()
            deadline = time.monotonic() + 120
            while await queued() > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(2.0)
            rounds.append({"queued_seen": q, "streams_ended_early": failed,
                           "rss_queued_mib": with_queue / 1024,
                           "rss_after_cancel_mib": rss_kb(pid) / 1024,
                           "queued_after_cancel": await queued()})
        for ch in channels:
            await ch.close()
        first = rounds[0]
        return {"requests": n, "body_bytes": len(payload), "rss_before_mib": before / 1024,
                **first, "kib_per_queued": (first["rss_queued_mib"] * 1024 - before)
                / max(1, first["queued_seen"]), "second_round": rounds[1],
                "alive": epp.proc.poll() is None}
    finally:
        epp.stop()
        server.close()


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench.rss_per_request", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--queued", type=int, default=0, help="measure the EPP with N queued instead")
    ap.add_argument("--body-bytes", type=int, default=3200,
                    help="--queued: prompt bytes per queued request (~800 tokens)")
    args = ap.parse_args()
    if args.queued:
        res = asyncio.run(queued_rss(args.queued, args.body_bytes,
                                     Path(tempfile.mkdtemp(prefix="epp-queued-rss-"))))
        print(json.dumps(res, indent=1))
        return
    default = measure(None, args.seconds, args.concurrency)
    graceful = measure(GRACEFUL_CLOSE, args.seconds, args.concurrency)
    print(f"Closed loop, {args.concurrency} connections, {args.seconds:g} s measured after "
          f"{args.seconds / 4:g} s of warm-up; requests: {default['requests']} (Envoy default), "
          f"{graceful['requests']} (graceful close); errors: {default['errors']}, "
          f"{graceful['errors']}.\n")
    print("| service | Envoy default, B/request | graceful close, B/request |")
    print("|---|---:|---:|")
    for name in ("bbr", "epp"):
        print(f"| {name} | {default[name]:.0f} | {graceful[name]:.0f} |")
    if default["errors"] or graceful["errors"]:
        sys.exit("errors during the run")


if __name__ == "__main__":
    main()
