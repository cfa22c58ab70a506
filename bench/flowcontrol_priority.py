"""Overload with priorities (issue #14's third target): critical traffic while sheddable
traffic floods the pool, and the EPP's memory with 10,000 requests queued.

    python -m bench.flowcontrol_priority                  # 5 seeds, both parts
    python -m bench.flowcontrol_priority --seeds 0 --duration 10 --skip-rss
    python -m bench.flowcontrol_priority --rss-only

**Flood.** Critical requests (InferenceObjective ``critical``, priority 1) arrive as a Poisson
stream of the ShareGPT-like mix at ``--critical-load`` x the fleet's nominal capacity;
sheddable ones (``sheddable``, priority -1) at ``--flood-load`` x capacity. Per seed and
contender two runs on the same critical schedule: "idle" (critical alone) and "flood" (with
the sheddable stream). Reported per contender, medians over seeds with a 95% bootstrap
interval (``bench.stats``): critical TTFT p90 idle, under the flood, and their per-seed ratio
(target <= 1.3); the sheddable requests' answers (200 / 429 / other); the largest queue
and RSS the EPP showed during the flood (sampled every 0.5 s), and whether it was still
running at the end.

**10,000 queued.** A running ``epp`` process (flow control on, its one endpoint a small
HTTP server whose metrics say the pool is saturated, so everything waits) gets 10,000
ext_proc streams straight from this process (gRPC, as Envoy would send them; Envoy's
default circuit breaker allows 1,024 concurrent streams to one cluster, so a single default
Envoy could not queue this many), all opened at once. Its RSS (``/proc``) is read before,
with all 10,000 queued, and after they are cancelled; then a second round of 10,000 shows
whether the memory freed by the first is reused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import orjson

from bench.compare import RUNS, run_one
from bench.contenders import TUNED_CONFIG, Contender, EnvoyLB, Epp, SimFleet
from bench.flowcontrol_probe import FlowEpp
from bench.openloop import Outcome
from bench.stats import bootstrap_median
from bench.workloads import FLEET_SIZE, WORKLOADS, RequestSpec, Workload, lengths, poisson_arrivals
from devkit.reliability.gateway import rss_kb
from devkit.stats import percentile as pct

X = "inference.networking.x-k8s.io/v1alpha2"
#: ``critical`` (priority 1); ``sheddable`` (-1) is one of the objectives every benchmark
#: pool declares (``bench.workloads.OBJECTIVES``).
OBJECTIVES: list[dict[str, Any]] = [
    {"apiVersion": X, "kind": "InferenceObjective", "metadata": {"name": "critical",
                                                                 "namespace": "default"},
     "spec": {"poolRef": {"name": "sims"}, "priority": 1}}]
SHAREGPT = WORKLOADS["sharegpt"]


def priority_config(max_concurrency: int, sheddable_queue: int,
                    sheddable_ceiling: float = 1.0) -> str:
    """TUNED_CONFIG + flow control dispatching on upstream's ``concurrency-detector``
    (requests in flight per endpoint, also a filter so no endpoint goes past it); the
    sheddable band holds at most ``sheddable_queue`` requests, so a flood gets 429s. With
    ``sheddable_ceiling`` < 1, ``priority-usage-limit-policy`` stops sheddable dispatch at
    that saturation, keeping the rest of the pool for critical requests."""
    cfg = TUNED_CONFIG.replace("plugins:\n", f"""plugins:
- type: concurrency-detector
  parameters: {{maxConcurrency: {max_concurrency}}}
- type: priority-usage-limit-policy
  name: reserve
  parameters: {{bands: [{{priority: -1, threshold: {sheddable_ceiling}}}]}}
""", 1).replace("  plugins:\n", "  plugins:\n  - pluginRef: concurrency-detector\n", 1)
    limit = "  usageLimitPolicyPluginRef: reserve\n" if sheddable_ceiling < 1 else ""
    return cfg + f"""\
saturationDetector: {{pluginRef: concurrency-detector}}
featureGates:
- flowControl
flowControl:
{limit}  defaultRequestTTL: 60s
  priorityBands:
  - priority: -1
    maxRequests: {sheddable_queue}
"""


@dataclass(frozen=True)
class PriorityMix:
    """Critical requests at ``critical`` x capacity, plus sheddable ones at ``flood`` x
    capacity when ``flood`` > 0; both the ShareGPT-like mix, told apart by the objective
    header. The critical schedule depends only on the seed (same in idle and flood runs)."""

    #: run_one's per-class report is not used; this bench splits classes itself.
    by_class = False

    name: str
    critical: float
    flood: float

    def capacity(self, servers: int = FLEET_SIZE) -> float:
        return SHAREGPT.capacity(servers)

    def schedule(self, load: float, duration: float, seed: int = 0,
                 servers: int = FLEET_SIZE) -> list[RequestSpec]:
        specs = []
        for cls, share in (("critical", self.critical), ("sheddable", self.flood)):
            if share <= 0:
                continue
            rng = random.Random(f"priority:{cls}:{seed}")
            rate = load * share * self.capacity(servers)
            times = poisson_arrivals(rng, rate, max(1, round(rate * duration)))
            specs += [replace(s, tag=cls, headers={"x-gateway-inference-objective": cls})
                      for s in lengths(rng, SHAREGPT.parameters, times)]
        return sorted(specs, key=lambda s: s.at)


class SampledFlowEpp(FlowEpp):
    """:class:`FlowEpp` that also samples, every 0.5 s while it runs, the EPP's queue length
    (``/debug/pool``) and RSS, and notes whether the process is alive at the end."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.samples: list[tuple[int, int]] = []
        self.alive_at_end = False

    @contextlib.contextmanager
    def running(self, fleet: SimFleet, workdir: Path) -> Iterator[str]:
        self.samples = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                queued = int(self.debug_pool().get("flowControl", {}).get("queued", 0))
                with contextlib.suppress(OSError):
                    self.samples.append((queued, rss_kb(self.pid)))

        with super().running(fleet, workdir) as url:
            t = threading.Thread(target=sample, daemon=True)
            t.start()
            try:
                yield url
            finally:
                stop.set()
                t.join()
                self.alive_at_end = _alive(self.pid)

    def debug_pool(self) -> dict[str, Any]:
        return Epp.debug(self)

    def debug(self) -> dict[str, Any]:
        data = super().debug()
        data["samples"] = self.samples
        return data


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0
    except OSError:
        return False


def contenders(max_concurrency: int, sheddable_queue: int,
               sheddable_ceiling: float, low_ceiling: float = 0.25) -> list[Contender]:
    return [EnvoyLB("envoy-rr", "ROUND_ROBIN"),
            Epp("epp-tuned", TUNED_CONFIG, OBJECTIVES),
            SampledFlowEpp("epp-flowcontrol-priority",
                           priority_config(max_concurrency, sheddable_queue), OBJECTIVES),
            SampledFlowEpp("epp-flowcontrol-reserve",
                           priority_config(max_concurrency, sheddable_queue, sheddable_ceiling),
                           OBJECTIVES),
            SampledFlowEpp("epp-flowcontrol-reserve-low",
                           priority_config(max_concurrency, sheddable_queue, low_ceiling),
                           OBJECTIVES)]


def flood_part(args: argparse.Namespace, run_dir: Path) -> None:
    seeds = [int(s) for s in args.seeds.split(",")]
    cs = [c for c in contenders(args.max_concurrency, args.sheddable_queue,
                                args.sheddable_ceiling, args.low_ceiling)
          if not args.contenders or c.name in args.contenders.split(",")]
    rows: dict[str, list[dict[str, Any]]] = {}
    for i, seed in enumerate(seeds):
        for c in cs[i % len(cs):] + cs[:i % len(cs)]:
            row: dict[str, Any] = {"seed": seed}
            for kind, flood in (("idle", 0.0), ("flood", args.flood_load)):
                w = PriorityMix(kind, args.critical_load, flood)
                workdir = run_dir / f"{seed}-{c.name}-{kind}"
                run_one(cast(Workload, w), 1.0, c, duration=args.duration, seed=seed,
                        servers=args.servers, time_scale=1.0, workdir=workdir,
                        progress=False, timeout=args.timeout)
                specs = w.schedule(1.0, args.duration, seed, args.servers)
                outcomes = [Outcome(**orjson.loads(line)) for line in
                            (workdir / "outcomes.jsonl").read_bytes().splitlines()]
                crit = [o.ttft for s, o in zip(specs, outcomes, strict=True)
                        if s.tag == "critical" and o.ok and o.ttft is not None]
                row[f"{kind}_p90"] = pct(crit, 0.9)
                row[f"{kind}_critical_errors"] = sum(
                    1 for s, o in zip(specs, outcomes, strict=True)
                    if s.tag == "critical" and not o.ok)
                if flood:
                    shed = [o for s, o in zip(specs, outcomes, strict=True)
                            if s.tag == "sheddable"]
                    row["sheddable"] = len(shed)
                    row["sheddable_ok"] = sum(1 for o in shed if o.ok)
                    row["sheddable_429"] = sum(1 for o in shed if o.status == 429)
                    row["sheddable_other"] = len(shed) - row["sheddable_ok"] - \
                        row["sheddable_429"]
                    if isinstance(c, SampledFlowEpp):
                        row["max_queued"] = max((q for q, _ in c.samples), default=0)
                        row["max_rss_mib"] = max((r for _, r in c.samples), default=0) / 1024
                        row["alive"] = c.alive_at_end
            row["ratio"] = row["flood_p90"] / row["idle_p90"] if row["idle_p90"] else 0.0
            rows.setdefault(c.name, []).append(row)
            print(f"seed {seed} {c.name}: critical TTFT p90 idle {row['idle_p90']:.3f} s, "
                  f"flood {row['flood_p90']:.3f} s (x{row['ratio']:.2f}); sheddable "
                  f"{row['sheddable_ok']} ok / {row['sheddable_429']} 429 / "
                  f"{row['sheddable_other']} other of {row['sheddable']}; critical errors "
                  f"{row['flood_critical_errors']}"
                  + (f"; max queued {row['max_queued']}, max RSS "
                     f"{row['max_rss_mib']:.0f} MiB, alive {row['alive']}"
                     if "alive" in row else ""), flush=True)
    print(f"\npriorities: critical {args.critical_load}x, sheddable flood "
          f"{args.flood_load}x capacity, seeds {seeds}; median [95% bootstrap interval]")
    print("| contender | critical TTFT p90 idle s | under flood s | flood / idle | "
          "critical errors | sheddable ok / 429 / other | max queued | max RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, rs in rows.items():
        def iv(k: str, rs: list[dict[str, Any]] = rs) -> str:
            return str(bootstrap_median([r[k] for r in rs]))
        tot = {k: sum(r[k] for r in rs) for k in ("sheddable_ok", "sheddable_429",
                                                   "sheddable_other", "flood_critical_errors")}
        extra = (f"{max(r['max_queued'] for r in rs)} | "
                 f"{max(r['max_rss_mib'] for r in rs):.0f}" if "alive" in rs[0] else "n/a | n/a")
        print(f"| {name} | {iv('idle_p90')} | {iv('flood_p90')} | {iv('ratio')} | "
              f"{tot['flood_critical_errors']} | {tot['sheddable_ok']} / "
              f"{tot['sheddable_429']} / {tot['sheddable_other']} | {extra} |")
    (run_dir / "results.json").write_text(json.dumps(rows, indent=1))


# --- 10,000 queued requests in a running EPP ------------------------------------------------

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


async def rss_part(n: int, body_bytes: int, workdir: Path) -> dict[str, Any]:
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--contenders", default="", help="comma-separated subset")
    p.add_argument("--critical-load", type=float, default=0.3)
    p.add_argument("--flood-load", type=float, default=2.0)
    p.add_argument("--max-concurrency", type=int, default=8,
                   help="concurrency-detector maxConcurrency of the flow-control contender")
    p.add_argument("--sheddable-queue", type=int, default=200,
                   help="maxRequests of the sheddable band")
    p.add_argument("--sheddable-ceiling", type=float, default=0.5,
                   help="epp-flowcontrol-reserve: saturation above which sheddable requests "
                        "wait (priority-usage-limit-policy)")
    p.add_argument("--low-ceiling", type=float, default=0.25,
                   help="epp-flowcontrol-reserve-low: the same with this lower ceiling (fewer "
                        "sheddable prefills share a critical request's engine steps)")
    p.add_argument("--duration", type=float, default=20.0, help="model seconds per run")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--servers", type=int, default=FLEET_SIZE)
    p.add_argument("--queued", type=int, default=10_000)
    p.add_argument("--body-bytes", type=int, default=3200,
                   help="prompt bytes per queued request (~800 tokens)")
    p.add_argument("--skip-rss", action="store_true")
    p.add_argument("--rss-only", action="store_true")
    args = p.parse_args(argv)
    run_dir = RUNS / f"flowcontrol-priority-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    if not args.rss_only:
        flood_part(args, run_dir)
    if not args.skip_rss:
        res = asyncio.run(rss_part(args.queued, args.body_bytes, run_dir / "rss"))
        print(f"\nEPP RSS with {res['queued_seen']} queued requests ({res['body_bytes']} B "
              f"bodies): before {res['rss_before_mib']:.1f} MiB, queued "
              f"{res['rss_queued_mib']:.1f} MiB ({res['kib_per_queued']:.2f} KiB each), after "
              f"cancelling {res['rss_after_cancel_mib']:.1f} MiB with "
              f"{res['queued_after_cancel']} left; {res['streams_ended_early']} streams ended "
              f"before being cancelled; EPP alive: {res['alive']}")
        two = res["second_round"]
        print(f"second round: {two['queued_seen']} queued, RSS {two['rss_queued_mib']:.1f} MiB, "
              f"after cancelling {two['rss_after_cancel_mib']:.1f} MiB with "
              f"{two['queued_after_cancel']} left; {two['streams_ended_early']} ended early")
        (run_dir / "rss.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
