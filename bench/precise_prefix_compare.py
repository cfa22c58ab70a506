"""Precise (KV-event) prefix routing vs the approximate prefix scorer and the peers, on a
shared-prefix workload with cache pressure and a server restart mid-run (issue #15).

Per seed and contender: a fresh ``vllm-sim`` process serving ``--servers`` servers on
127.0.0.1 (one port each; KV events on port + ``OFFSET``) with a small KV cache
(``--kv-blocks`` blocks, below the working set of the shared prefixes), and the router:

- ``precise``: Envoy + EPP with ``token-producer`` (the last server's ``/tokenize``; server 0
  is the one restarted) and ``precise-prefix-cache-scorer`` (weight 3) beside the load
  scorers (``--load-scorers``: ``queue-scorer`` weight 1 by default; ``upstream``: upstream
  v1.5's default profile, ``queue-scorer`` and ``kv-cache-utilization-scorer`` weight 2);
- ``precise-speculative``: the same with ``speculativeIndexing: true`` (TTL 2 s);
- ``approximate``: Envoy + EPP with ``prefix-cache-scorer`` (weight 3) and the same load
  scorers;
- ``round-robin``: Envoy's ``ROUND_ROBIN`` over the same servers;
- ``approximate-shared`` (only with ``--epp-replicas`` >= 2): the approximate replicas
  sharing their prefix index and in-flight counts through a real Valkey (``--state-store``,
  issue #18: what sharing buys);
- ``sglang-router:cache_aware``, ``vllm-router:cache_aware``: the peer routers
  (``bench/peers.py``, ``python -m bench.peers install`` first), as they come.

``--contenders`` picks a subset.

``--epp-replicas N`` (N >= 2): every EPP contender runs as N active-active replicas
(``--ha-mode active-active``) behind the one Envoy, which spreads the ext_proc streams over
them (:func:`devkit.envoy.replica_cluster`). Apart from ``approximate-shared`` they share
nothing (``--state-store memory://``): an approximate replica learns only its own picks, a
precise replica subscribes to every server's KV events and so sees every pick.
``round-robin`` is Envoy alone. ``--peer-replicas N``: each peer runs as N processes behind
Envoy's round-robin (neither peer shares its cache tree between processes, so this is how a
user scales one out); one process by default.

The workload (seeded, the same for every contender): ``--requests`` streamed completions
from ``--concurrency`` workers, each a shared prefix (``--prefixes`` of ``--prefix-blocks``
blocks, Zipf-weighted) plus a unique question; one request in ``--background`` goes straight
to a random server with an unrelated long prompt (traffic the EPP did not route, which evicts;
``--background-shared``: with a shared prefix instead); halfway through, server 0 is killed
and revived a second later (a cold cache).

Figures per run: TTFT p90 of routed requests, and the prefix-cache hit rate from the servers'
own counters (``usage.prompt_tokens_details.cached_tokens`` / ``prompt_tokens``); blocks the
servers evicted (``/sim/state``); for EPP contenders the KV-event lag and stream figures from
the EPP's ``/metrics``; a per-request trace (``trace.jsonl`` in the run's directory). Over
seeds: paired ratios precise / baseline, median and 95% bootstrap interval
(``bench/stats.py``), and the schedule's hit-rate ceiling (:func:`ceiling`).

    python -m bench.precise_prefix_compare --seeds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.contenders import _popen, _stop, _tail, http_ok, pool_gateway_config
from bench.peers import PEERS, peer_env
from bench.stats import bootstrap_median, paired_ratios, quantile, verdict
from devkit import envoy as e
from devkit.manifests import ports_pool_manifests
from devkit.net import free_port_run
from devkit.valkey import ValkeyServer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OFFSET = 1000
BLOCK = 16  # tokens per block (the 8b-h100 profile's block size)


#: The load scorers beside the prefix scorer (weight 3): ``queue``, the queue scorer at weight
#: 1 (prefix-sticky); ``upstream``, upstream v1.5's default profile (queue and KV-cache
#: utilization scorers at weight 2 each).
LOAD_SCORERS = {"queue": (("queue-scorer", 1),),
                "upstream": (("queue-scorer", 2), ("kv-cache-utilization-scorer", 2))}


def epp_config(name: str, base: int, n: int, load: str = "queue") -> str:
    """The EndpointPickerConfig of EPP contender ``name``: its prefix scorer at weight 3 and
    the ``load`` scorers (:data:`LOAD_SCORERS`)."""
    if name.startswith("precise"):
        spec = "\n    speculativeIndexing: true" if name == "precise-speculative" else ""
        prefix = "precise-prefix-cache-scorer"
        plugins = f"""\
- type: token-producer
  parameters: {{modelName: {MODEL}, vllm: {{http: "http://127.0.0.1:{base + n - 1}"}}}}
- type: {prefix}
  parameters:
    tokenProcessorConfig: {{blockSize: {BLOCK}}}
    kvEventsConfig: {{topicFilter: "kv@", podDiscoveryConfig: {{socketPortOffset: {OFFSET}}}}}{spec}
"""
    else:
        prefix = "prefix-cache-scorer"
        plugins = f"- type: {prefix}\n"
    scorers = LOAD_SCORERS[load]
    plugins += "".join(f"- type: {t}\n" for t, _ in scorers)
    refs = "".join(f"  - {{pluginRef: {t}, weight: {w}}}\n" for t, w in ((prefix, 3), *scorers))
    return ("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
            f"plugins:\n{plugins}schedulingProfiles:\n- name: default\n  plugins:\n{refs}")


PEER_CONTENDERS = ("sglang-router:cache_aware", "vllm-router:cache_aware")
CONTENDERS = ("precise", "precise-speculative", "approximate", "approximate-shared",
              "round-robin", *PEER_CONTENDERS)


@dataclass(frozen=True)
class Args:
    servers: int
    kv_blocks: int
    prefixes: int
    prefix_blocks: int
    requests: int
    concurrency: int
    background: int
    time_scale: float
    #: The unrouted requests carry a shared prefix (another client of the same servers
    #: sending the same system prompts straight to a server) instead of unrelated text.
    background_shared: bool = False


@dataclass
class Run:
    ttfts: list[float]
    prompt_tokens: int
    cached_tokens: int
    failures: int
    #: Blocks the servers evicted (their own ``/sim/state`` counters; server 0's count
    #: restarts from 0 at its revival).
    evictions: int = 0
    #: The EPP's own figures (precise contenders): KV-event lag p99 (histogram bucket bound),
    #: batches indexed, publisher restarts + disconnects seen, fallback requests.
    epp: dict[str, float] = field(default_factory=dict)

    @property
    def ttft_p90(self) -> float:
        return quantile(self.ttfts, 0.9)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@contextmanager
def fleet(a: Args, seed: int, workdir: Path) -> Iterator[int]:
    """The simulator process; yields the first server's port."""
    base = free_port_run(a.servers, OFFSET)
    kv = {"enable_kv_cache_events": True, "publisher": "zmq",
          "endpoint": f"tcp://*:{base + OFFSET}", "topic": "kv@{host}@{model}"}
    config = {
        "defaults": {"profile": "8b-h100", "time_scale": a.time_scale, "seed": seed,
                     "model": MODEL, "overrides": {"num_gpu_blocks": a.kv_blocks},
                     "kv_events_config": kv},
        "servers": [{"host": "127.0.0.1", "port": base + i, "name": f"sim-{i}",
                     "seed": seed + i} for i in range(a.servers)],
    }
    path = workdir / "fleet.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.main", "--config", str(path), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=(workdir / "sim.log").open("ab"), text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("vllm-sim ready:"):
        _stop(proc)
        raise RuntimeError(f"simulator did not start: {line!r} {_tail(workdir / 'sim.log')}")
    try:
        yield base
    finally:
        _stop(proc)


@contextmanager
def router(name: str, base: int, n: int, workdir: Path, replicas: int = 1,
           peer_replicas: int = 1, load: str = "queue") -> Iterator[tuple[str, list[int]]]:
    """Start contender ``name``; yields its URL and (EPP contenders) the metrics port of each
    EPP replica (``replicas`` of them, active-active behind one Envoy when more than one; a
    peer runs as ``peer_replicas`` processes, behind Envoy's round-robin when more than
    one)."""
    admin, listen = e.free_port(), e.free_port()
    if name == "round-robin":
        cluster = e.static_cluster("fleet", [("127.0.0.1", base + i) for i in range(n)],
                                   lb_policy="ROUND_ROBIN")
        cluster["connect_timeout"] = "5s"
        cfg = e.bootstrap(admin, [e.listener(listen, [e.route("fleet")], [])], [cluster])
        with e.Envoy(cfg, admin_port=admin, workdir=workdir / "envoy"):
            yield f"http://127.0.0.1:{listen}", []
        return
    if name in PEER_CONTENDERS:
        workers = [f"http://127.0.0.1:{base + i}" for i in range(n)]
        try:
            urls = [peer_router(name, workers, workdir, i) for i in range(peer_replicas)]
            if peer_replicas == 1:
                yield urls[0], []
                return
            # N copies behind Envoy, each with its own cache tree (neither peer shares it
            # between processes): how a user scales a peer out for availability.
            cluster = e.static_cluster(
                "peers", [("127.0.0.1", int(u.rsplit(":", 1)[1])) for u in urls],
                lb_policy="ROUND_ROBIN")
            cfg = e.bootstrap(admin, [e.listener(listen, [e.route("peers")], [])], [cluster])
            with e.Envoy(cfg, admin_port=admin, workdir=workdir / "envoy"):
                yield f"http://127.0.0.1:{listen}", []
        finally:
            stop_peers()
        return
    (workdir / "pool.yaml").write_text(yaml.safe_dump_all(
        ports_pool_manifests("sims", "127.0.0.1", [base + i for i in range(n)])))
    (workdir / "epp.yaml").write_text(epp_config(name, base, n, load))
    with ExitStack() as stack:
        ha: list[str] = []
        if replicas > 1:
            store = "memory://"
            if name == "approximate-shared":
                store = stack.enter_context(ValkeyServer()).url
            ha = ["--ha-mode", "active-active", "--state-store", store]
        ports: list[tuple[int, int]] = []
        metrics: list[int] = []
        procs = []
        for i in range(replicas):
            grpc, health, mport = e.free_port(), e.free_port(), e.free_port()
            log = workdir / (f"epp-{i}.log" if replicas > 1 else "epp.log")
            proc = _popen([sys.executable, "-m", "epp.main", "--manifests",
                           str(workdir / "pool.yaml"), "--secure-serving=false",
                           "--grpc-port", str(grpc), "--grpc-health-port", str(health),
                           "--metrics-port", str(mport), "--grace-period", "2",
                           "--config-file", str(workdir / "epp.yaml"), *ha], log)
            stack.callback(_stop, proc)
            procs.append((proc, log))
            ports.append((grpc, health))
            metrics.append(mport)
        for grpc, _ in ports:
            e.wait_for_port(grpc, timeout=30)
        time.sleep(1.0)  # the first scrapes and (precise) the subscriptions
        for proc, log in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"epp exited: {_tail(log)}")
        endpoints = [f"127.0.0.1:{base + i}" for i in range(n)]
        config = pool_gateway_config(ports[0][0], admin, listen, endpoints,
                                     replicas=ports if replicas > 1 else ())
        with e.Envoy(config, admin_port=admin, workdir=workdir / "envoy"):
            yield f"http://127.0.0.1:{listen}", metrics


_PEER_PROCS: list[subprocess.Popen[bytes]] = []


def peer_router(name: str, workers: list[str], workdir: Path, index: int = 0) -> str:
    """Start copy ``index`` of peer ``name`` (``<peer>:<policy>``) in front of ``workers``;
    its URL. The process is stopped by :func:`stop_peers`."""
    peer_name, policy = name.split(":")
    peer = PEERS[peer_name]
    if not peer.installed():
        raise RuntimeError(f"{peer.package} not installed: python -m bench.peers install")
    port, prom = e.free_port(), e.free_port()
    log = workdir / f"{peer.name}-{index}.log"
    cmd = peer.command(policy=policy, port=port, prometheus_port=prom, workers=workers)
    with (workdir / "command.txt").open("a") as f:
        f.write(" ".join(cmd) + "\n")
    proc = _popen(cmd, log, env=peer_env())
    _PEER_PROCS.append(proc)
    deadline = time.monotonic() + 60
    while not http_ok(f"http://127.0.0.1:{port}/v1/models"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_peers()
            raise RuntimeError(f"{name} did not start: {_tail(log)}")
        time.sleep(0.2)
    return f"http://127.0.0.1:{port}"


def stop_peers() -> None:
    while _PEER_PROCS:
        _stop(_PEER_PROCS.pop())


def server_evictions(base: int, n: int) -> int:
    """Blocks evicted by the servers, from their own counters (``GET /sim/state``)."""
    total = 0
    for i in range(n):
        deadline = time.monotonic() + 10  # server 0 may still be reviving (short runs)
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{base + i}/sim/state",
                                            timeout=5) as r:
                    total += int(json.loads(r.read())["evictions"])
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return total


def epp_figures(metrics_ports: list[int]) -> dict[str, float]:
    """KV-event figures from the EPP replicas' own Prometheus series, summed over the
    replicas (the lag quantiles from their merged histogram); ``picks_<i>``: the scheduling
    attempts of replica ``i`` (how Envoy spread the streams)."""
    sums: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for i, port in enumerate(metrics_ports):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "inference_extension_kv_events_lag_seconds_bucket":
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + s.value
                elif s.name in _EPP_SERIES:
                    key = _EPP_SERIES[s.name]
                    sums[key] = sums.get(key, 0.0) + s.value
                elif s.name == "inference_extension_scheduler_attempts_total":
                    sums[f"picks_{i}"] = sums.get(f"picks_{i}", 0.0) + s.value
    if buckets and max(buckets.values()) > 0:
        ordered = sorted(buckets.items())
        total = ordered[-1][1]
        sums["lag_p50_le_s"] = next((le for le, c in ordered if c >= 0.5 * total), math.inf)
        sums["lag_p99_le_s"] = next((le for le, c in ordered if c >= 0.99 * total), math.inf)
        sums["lag_count"] = total
        for le, count in ordered:  # cumulative, to pool the runs (:func:`pooled_lag`)
            sums[f"lag_le_{le:g}"] = count
    return sums


def pooled_lag(runs: list[Run], q: float) -> float:
    """The ``q`` quantile (a histogram bucket bound) of the KV-event lag of all ``runs``
    together: one run has too few batches (~100) for its p99 to be more than its worst."""
    counts: dict[float, float] = {}
    for run in runs:
        for key, value in run.epp.items():
            if key.startswith("lag_le_"):
                le = float(key.removeprefix("lag_le_"))
                counts[le] = counts.get(le, 0.0) + value
    if not counts:
        return math.nan
    ordered = sorted(counts.items())
    total = ordered[-1][1]
    return next((le for le, c in ordered if c >= q * total), math.inf)


_EPP_SERIES = {
    "inference_extension_kv_events_batches_total": "batches",
    "inference_extension_kv_events_publisher_restarts_total": "publisher_restarts",
    "inference_extension_kv_events_disconnects_total": "disconnects",
    "inference_extension_precise_prefix_fallback_total": "fallbacks",
    "inference_extension_kv_events_blocks_total": "blocks_indexed",
    "inference_extension_kv_events_skipped_events_total": "skipped_events",
    "inference_extension_kv_events_sequence_gaps_total": "gaps",
}


def schedule(a: Args, seed: int) -> list[tuple[str, str]]:
    """``(kind, prompt)``: kind ``routed`` or ``direct:<server>``."""
    rng = random.Random(seed)
    prefixes = [f"[prefix {seed}-{p}] " + " ".join(
        rng.choice(("alpha", "beta", "gamma", "delta", "omega", "sigma")) for _ in range(2000))
        for p in range(a.prefixes)]
    plen = a.prefix_blocks * BLOCK * 4  # the simulator: 4 bytes per token
    prefixes = [p[:plen] for p in prefixes]
    weights = [1 / (k + 1) for k in range(a.prefixes)]
    out: list[tuple[str, str]] = []
    for n in range(a.requests):
        p = rng.choices(prefixes, weights)[0]
        out.append(("routed", p + f" question {n}: {rng.random():.12f}?"))
        if a.background and n % a.background == a.background - 1:
            if a.background_shared:
                other = rng.choices(prefixes, weights)[0] + f" direct {n}: {rng.random():.12f}?"
            else:
                other = " ".join(str(rng.random()) for _ in range(a.prefix_blocks * BLOCK // 4))
            out.append((f"direct:{rng.randrange(a.servers)}", other))
    return out


def ceiling(a: Args, seed: int) -> float:
    """The best hit rate any router could reach on this schedule: every routed request hits
    its whole shared prefix except the first of each prefix (unbounded caches, no restart,
    perfect knowledge). A ratio to a baseline can be at most ``ceiling / baseline``."""
    seen: set[str] = set()
    hit = total = 0
    plen = a.prefix_blocks * BLOCK
    for kind, prompt in schedule(a, seed):
        if kind != "routed":
            continue
        tokens = -(-len(prompt.encode()) // 4)
        total += tokens
        prefix = prompt.split("]")[0]
        if prefix in seen:
            hit += min(plen, tokens - 1)
        seen.add(prefix)
    return hit / total if total else 0.0


async def one(session: aiohttp.ClientSession, url: str,
              prompt: str) -> tuple[float, int, int, str]:
    """TTFT, prompt tokens, cached tokens and the serving port of one streamed completion."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.monotonic()
    ttft = -1.0
    usage: dict[str, Any] = {}
    async with session.post(url + "/v1/completions", json=body) as resp:
        port = resp.headers.get("x-inference-port", "?")
        if resp.status != 200:
            raise RuntimeError(f"status {resp.status}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft < 0 and chunk.get("choices"):
                ttft = time.monotonic() - start
            if chunk.get("usage"):
                usage = chunk["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return ttft, int(usage.get("prompt_tokens", 0)), int(cached), port


async def drive(a: Args, seed: int, url: str, base: int, trace: Path | None = None) -> Run:
    """Run the schedule; ``trace``: one JSON line per routed request (for diagnosis)."""
    work = schedule(a, seed)
    lines: list[str] = []
    run = Run([], 0, 0, 0)
    queue: asyncio.Queue[tuple[int, str, str]] = asyncio.Queue()
    for i, (kind, prompt) in enumerate(work):
        queue.put_nowait((i, kind, prompt))
    half = len(work) // 2
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def worker() -> None:
            while not queue.empty():
                i, kind, prompt = queue.get_nowait()
                if i == half:  # the restart: server 0's cache comes back cold
                    async with session.post(f"http://127.0.0.1:{base + 1}/sim/kill",
                                            json={"port": base, "revive_after": 1.0}) as r:
                        await r.read()
                try:
                    if kind == "routed":
                        ttft, pt, cached, port = await one(session, url, prompt)
                        lines.append(json.dumps({"i": i, "prefix": prompt.split("]")[0][1:],
                                                 "port": port, "ttft": round(ttft, 4),
                                                 "prompt": pt, "cached": cached}))
                        run.ttfts.append(ttft)
                        run.prompt_tokens += pt
                        run.cached_tokens += cached
                    else:
                        target = base + int(kind.split(":")[1])
                        await one(session, f"http://127.0.0.1:{target}", prompt)
                except (TimeoutError, aiohttp.ClientError, RuntimeError):
                    run.failures += 1

        await asyncio.gather(*(worker() for _ in range(a.concurrency)))
    if trace is not None:
        trace.write_text("\n".join(lines) + "\n")
    return run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--kv-blocks", type=int, default=300)
    ap.add_argument("--prefixes", type=int, default=12)
    ap.add_argument("--prefix-blocks", type=int, default=48)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--background", type=int, default=4,
                    help="one direct (unrouted) request after every N routed ones (0: none)")
    ap.add_argument("--background-shared", action="store_true",
                    help="the direct requests carry the shared prefixes (default: unrelated "
                         "text)")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--epp-replicas", type=int, default=1,
                    help="EPP contenders run as N active-active replicas behind one Envoy, "
                         "sharing nothing but approximate-shared's Valkey")
    ap.add_argument("--peer-replicas", type=int, default=1,
                    help="each peer runs as N processes behind Envoy's round-robin, each "
                         "with its own cache tree (how a peer is scaled out)")
    ap.add_argument("--load-scorers", choices=sorted(LOAD_SCORERS), default="queue",
                    help="beside every EPP's prefix scorer (weight 3): queue = queue-scorer "
                         "weight 1; upstream = upstream v1.5's default profile (queue-scorer "
                         "and kv-cache-utilization-scorer, weight 2 each)")
    ap.add_argument("--contenders", default=None,
                    help=f"comma-separated subset of {', '.join(CONTENDERS)} (default: all "
                         "that fit --epp-replicas)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/precise-prefix-bench"))
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ns = ap.parse_args(argv)
    names = ([c for c in ns.contenders.split(",") if c] if ns.contenders is not None else
             [c for c in CONTENDERS if c != "approximate-shared" or ns.epp_replicas > 1])
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown:
        ap.error(f"--contenders: unknown {', '.join(unknown)}")
    if ns.epp_replicas < 1:
        ap.error("--epp-replicas: at least 1")
    if ns.peer_replicas < 1:
        ap.error("--peer-replicas: at least 1")
    if "approximate-shared" in names and ns.epp_replicas < 2:
        ap.error("--contenders: approximate-shared needs --epp-replicas 2 or more (one "
                 "replica has nobody to share with)")
    a = Args(ns.servers, ns.kv_blocks, ns.prefixes, ns.prefix_blocks, ns.requests,
             ns.concurrency, ns.background, ns.time_scale, ns.background_shared)
    results: dict[str, dict[int, Run]] = {c: {} for c in names}
    for seed in range(ns.first_seed, ns.first_seed + ns.seeds):
        for name in names:
            wd = ns.workdir / f"seed{seed}" / name.replace(":", "-")
            wd.mkdir(parents=True, exist_ok=True)
            with fleet(a, seed, wd) as base, \
                    router(name, base, a.servers, wd, ns.epp_replicas,
                           ns.peer_replicas, ns.load_scorers) as (url, mp):
                run = asyncio.run(drive(a, seed, url, base, wd / "trace.jsonl"))
                time.sleep(0.5)  # the last events reach the index
                run.evictions = server_evictions(base, a.servers)
                if mp:
                    run.epp = epp_figures(mp)
            results[name][seed] = run
            shown = {k: v for k, v in run.epp.items() if not k.startswith("lag_le_")}
            print(f"seed {seed} {name:12s} ttft_p90={run.ttft_p90 * 1000:7.1f} ms "
                  f"hit={run.hit_rate:.3f} failures={run.failures} evictions={run.evictions} "
                  f"epp={shown} load1={os.getloadavg()[0]:.1f}", flush=True)
    ceilings = {seed: ceiling(a, seed)
                for seed in range(ns.first_seed, ns.first_seed + ns.seeds)}
    report(results, ns, ceilings)


def report(results: dict[str, dict[int, Run]], ns: argparse.Namespace,
           ceilings: dict[int, float]) -> None:
    """Medians per contender, then the issue's checks as paired ratios (those whose
    contenders ran)."""
    p90 = {c: {s: r.ttft_p90 for s, r in runs.items()} for c, runs in results.items()}
    hit = {c: {s: r.hit_rate for s, r in runs.items()} for c, runs in results.items()}
    per_seed = {c: {s: {"ttft_p90_s": p90[c][s], "hit_rate": hit[c][s],
                        "failures": r.failures, "evictions": r.evictions, "epp": r.epp}
                    for s, r in results[c].items()} for c in results}
    out: dict[str, Any] = {"ceiling": ceilings, "per_seed": per_seed,
                           "epp_replicas": ns.epp_replicas, "peer_replicas": ns.peer_replicas,
                           "load_scorers": ns.load_scorers}
    lines = []
    if ns.epp_replicas > 1 or ns.peer_replicas > 1:
        scaled = ("one process each" if ns.peer_replicas == 1 else
                 f"{ns.peer_replicas} processes each behind Envoy's round-robin, each with its "
                 "own cache tree")
        replicas = "one process" if ns.epp_replicas == 1 else \
            f"{ns.epp_replicas} active-active replicas"
        lines += [f"EPP contenders: {replicas} behind one Envoy "
                  f"(sharing nothing but approximate-shared's Valkey); peers: {scaled}; "
                  "round-robin: Envoy alone.", ""]
    lines += ["| figure | median over seeds [95% interval] | target | verdict |",
             "|---|---|---|---|"]
    for c in results:
        lines.append(f"| {c}: TTFT p90 (ms) | "
                     f"{bootstrap_median([v * 1000 for v in p90[c].values()])} | | |")
        lines.append(f"| {c}: prefix-cache hit rate | {bootstrap_median(list(hit[c].values()))}"
                     " | | |")
    lines.append(f"| hit-rate ceiling of the schedule (any router) | "
                 f"{bootstrap_median(list(ceilings.values()))} | | |")
    if "approximate" in results:
        lines.append(f"| most any router can reach: ceiling / approximate's hit rate | "
                     f"{bootstrap_median(paired_ratios(ceilings, hit['approximate']))} | | |")
    peers = [c for c in results if c == "round-robin" or c in PEER_CONTENDERS]
    best = min(peers, key=lambda c: statistics.median(p90[c].values()), default=None)
    checks = []
    for ours in ("precise", "precise-speculative"):
        if ours not in results:
            continue
        if "approximate" in results:
            checks += [(f"TTFT p90 {ours} / approximate",
                        paired_ratios(p90[ours], p90["approximate"]), 0.7, True),
                       (f"hit rate {ours} / approximate",
                        paired_ratios(hit[ours], hit["approximate"]), 1.3, False)]
        if best is not None:
            checks.append((f"TTFT p90 {ours} / {best} (best peer here)",
                           paired_ratios(p90[ours], p90[best]), 0.8, True))
    for label, ratios, target, at_most in checks:
        iv = bootstrap_median(ratios)
        v = verdict(iv, target, at_most=at_most)
        lines.append(f"| {label} | {iv} | {'≤' if at_most else '≥'} {target} | {v} |")
        out[label] = {"median": iv.median, "lo": iv.lo, "hi": iv.hi, "target": target,
                      "verdict": v}
    # What sharing buys (no target): the shared-Valkey replicas against the unshared ones and
    # against precise replicas, which share nothing but see every pick through the events.
    if "approximate-shared" in results:
        pairs = [("approximate-shared", "approximate")]
        pairs += [(c, "approximate-shared") for c in ("precise", "precise-speculative")
                  if c in results]
        for a, b in pairs:
            if b not in results:
                continue
            for what, fig in (("TTFT p90", p90), ("hit rate", hit)):
                iv = bootstrap_median(paired_ratios(fig[a], fig[b]))
                lines.append(f"| {what} {a} / {b} | {iv} | | |")
                out[f"{what} {a} / {b}"] = {"median": iv.median, "lo": iv.lo, "hi": iv.hi}
    for c, runs in results.items():
        p99 = pooled_lag(list(runs.values()), 0.99)
        if not math.isnan(p99):
            batches = sum(r.epp.get("lag_count", 0.0) for r in runs.values())
            lines.append(f"| {c}: KV-event lag p99 over all seeds' {batches:.0f} batches "
                         f"(bucket bound, s) | {p99:g} | ≤ 0.05 | "
                         f"{'met' if p99 <= 0.05 else 'not met'} |")
            out[f"{c} lag p99 pooled"] = p99
    print("\n".join(lines))
    if ns.json:
        ns.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
