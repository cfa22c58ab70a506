"""P/D disaggregation vs an aggregated fleet of the same size, and vs vllm-router's PD mode.

Run: ``python -m bench.pd_compare`` (defaults: 5 seeds x 3 fleets, 60 s of arrivals each;
about 21 minutes on a busy 2-core machine). Every run starts from nothing on loopback:

- **aggregated**: 4 ``8b-h100`` simulated servers behind Envoy + our EPP with its default
  config (queue, KV-cache and prefix scorers), as an upstream v1.5 user runs it;
- **pd**: 2 prefill + 2 decode servers (``--kv-transfer-config`` NixlConnector, ``rdma``
  link) labelled ``llm-d.ai/role``; a ``pd-sidecar`` process in front of each decode server;
  Envoy + our EPP with llm-d's P/D config (``disagg-profile-handler``,
  ``prefix-based-pd-decider`` with ``nonCachedTokens: 1024``);
- **vllm-router-pd**: the same 2 prefill + 2 decode servers (no sidecars, no Envoy, no EPP)
  behind vllm-router's PD mode (``--vllm-pd-disaggregation --kv-connector nixl``, its default
  ``cache_aware`` policy for both sides): it sends the prefill leg (``max_tokens: 1``,
  ``do_remote_decode``) and then the decode leg with the returned ``kv_transfer_params``, the
  protocol the simulator's NixlConnector roles speak. It disaggregates every request (no
  decider). Skipped with a note when the peer is not installed (``python -m bench.peers
  install``).

Variants, for the issue's sweep: ``--threshold`` (the decider's ``nonCachedTokens``),
``--split 3:1`` (prefill:decode servers; the aggregated fleet has their sum),
``--pd-config gie-scorers`` (both P/D profiles score with the aggregated fleet's scorers and
weights instead of llm-d's sample), ``--pd-config token-load`` (the prefill profile scores
prefix and in-flight prompt tokens), ``--pd-config spill`` (``token-load`` with our
``load-aware-pd-decider``: long prompts stay on nearly idle decode pods while every prefill
pod is backlogged), and ``--baseline DIR/results.json`` to reuse an earlier
run's aggregated fleets (same seeds and settings) so a sweep point runs only the P/D fleet.

sglang-router's PD mode is not a contender: it sends the request to the prefill and the
decode server at once with SGLang's ``bootstrap_host/port/room``, which vLLM ignores, so both
servers compute the whole request and no KV moves (docs/pd.md).

Workload (same schedule for both fleets of a seed; Poisson arrivals, every request streamed):
70 % long prompts (4,096-16,384 tokens in, 200-500 out, the issue's long-input workload) and
30 % chat-like streaming decodes (100-400 tokens in, 200-500 out), all prompts unique.

Reported per fleet: TTFT p90, TPOT p90 (per-request (e2e - TTFT)/(tokens - 1)), output tok/s,
over all requests and per class, in model seconds; medians over seeds. ``--time-scale N``
runs the simulator N times slower than the model so that the machine's own per-hop costs
(Envoy, EPP, sidecar, on a shared 2-core box) weigh less. Ratios pd/aggregated are paired per seed
(same schedule); their interval is a 95 % t-interval on the mean of the per-seed log ratios
(a geometric mean), printed beside the median ratio. A target is **met** when the whole
interval is on the right side of it, **not met** when the whole interval is on the wrong
side, otherwise **inconclusive**.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench.contenders import _popen, _stop, _tail, pool_gateway_config, wait_router_ready
from bench.openloop import Outcome
from bench.peers import PEERS, peer_env
from bench.workloads import MODEL, RequestSpec, _words, poisson_arrivals, write_specs
from devkit import envoy as e
from devkit.stats import percentile as pct
from modelserver.pd import ROLE_LABEL

_PD_PLUGINS = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters: {blockSizeTokens: 16, autoTune: false, maxPrefixBlocksToMatch: 256,
               lruCapacityPerServer: 31250}
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: %d}
- type: disagg-profile-handler
  parameters: {deciders: {prefill: prefix-based-pd-decider}}
"""
_LLM_D_PROFILES = """\
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker},
            {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: queue-scorer, weight: 1}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker},
            {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: queue-scorer, weight: 1}]
"""
_GIE_PROFILES = """\
- type: kv-cache-utilization-scorer
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker},
            {pluginRef: queue-scorer, weight: 2},
            {pluginRef: kv-cache-utilization-scorer, weight: 2},
            {pluginRef: prefix-cache-scorer, weight: 3}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker},
            {pluginRef: queue-scorer, weight: 2},
            {pluginRef: kv-cache-utilization-scorer, weight: 2},
            {pluginRef: prefix-cache-scorer, weight: 3}]
"""
#: The prefill profile that scores by prompt tokens in flight (``token-load`` and ``spill``).
_TOKEN_LOAD_PREFILL = """\
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker},
            {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: token-load-scorer, weight: 1}]
"""
_TOKEN_LOAD_PROFILES = "- type: token-load-scorer\n" + _TOKEN_LOAD_PREFILL + """\
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker},
            {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: queue-scorer, weight: 1}]
"""
_SPILL = _PD_PLUGINS.replace(
    "- type: prefix-based-pd-decider\n  parameters: {nonCachedTokens: %d}",
    "- type: load-aware-pd-decider\n  parameters: {nonCachedTokens: %d, "
    "prefillBacklogTokens: 8000, maxDecodeRequests: 2}").replace(
    "{prefill: prefix-based-pd-decider}", "{prefill: load-aware-pd-decider}") + """\
- type: token-load-scorer
- type: active-request-scorer
""" + _TOKEN_LOAD_PREFILL + """\
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker},
            {pluginRef: prefix-cache-scorer, weight: 2},
            {pluginRef: active-request-scorer, weight: 1}]
"""
#: The EPP configs of the ``pd`` fleet (``--pd-config``), ``%d`` being ``nonCachedTokens``.
#: ``llm-d``: llm-d's sample (deploy/config/pd-epp-config.yaml): prefix (2) and queue (1)
#: scorers in each profile. ``gie-scorers``: each profile scores with the aggregated fleet's
#: scorers and weights (GIE v1.5's default config: queue 2, KV-cache utilization 2, prefix 3).
#: ``token-load``: llm-d's sample with the prefill profile's queue scorer replaced by
#: ``token-load-scorer`` (the prompt tokens in flight, prefill picks included, on each
#: prefill pod): without prefix hits the prefill pick is the pod computing the fewest tokens.
#: ``spill``: ``token-load`` with our ``load-aware-pd-decider`` (a long prompt stays on its
#: decode pod when every prefill pod has 8,000 prompt tokens in flight and the decode pod at
#: most two requests) and the decode profile's queue scorer replaced by
#: ``active-request-scorer`` (the decode pick: the pod with the fewest requests in flight).
PD_CONFIGS = {"llm-d": _PD_PLUGINS + _LLM_D_PROFILES,
              "gie-scorers": _PD_PLUGINS + _GIE_PROFILES,
              "token-load": _PD_PLUGINS + _TOKEN_LOAD_PROFILES,
              "spill": _SPILL}
#: Issue #16's targets: metric -> (pd / aggregated bound, "le" | "ge").
TARGETS = {"tpot_p90": (0.6, "le"), "output_tps": (1.0, "ge"), "ttft_p90": (1.3, "le")}
#: The fleets, in run order within a seed; ratios are against ``aggregated``.
KINDS = ("aggregated", "pd", "vllm-router-pd")
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def workload(seed: int, rate: float, duration: float) -> list[RequestSpec]:
    """The mixed schedule of one seed (see the module docstring)."""
    rng = random.Random(seed)
    specs = []
    for at in poisson_arrivals(rng, rate, int(rate * duration)):
        long = rng.random() < 0.7
        tokens = rng.randint(4096, 16384) if long else rng.randint(100, 400)
        out = rng.randint(200, 500)
        specs.append(RequestSpec(at, "/v1/completions", {
            "model": MODEL, "prompt": _words(rng, tokens), "max_tokens": out,
            "stream": True, "stream_options": {"include_usage": True}},
            "long" if long else "short"))
    return specs


# -- the two fleets -----------------------------------------------------------------------

def _pod(name: str, ip: str, role: str | None) -> dict[str, Any]:
    labels = {"app": "sim"} | ({ROLE_LABEL: role} if role else {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": "default", "labels": labels}, "status": {"podIP": ip}}


def _pool(port: int, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
             "metadata": {"name": "sims", "namespace": "default"},
             "spec": {"selector": {"matchLabels": {"app": "sim"}},
                      "targetPorts": [{"number": port}],
                      "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}},
            *pods]


@dataclass
class Fleet:
    """What one run started: processes, and where to read the counters afterwards."""

    procs: list[subprocess.Popen[bytes]]
    url: str
    epp_metrics: int
    #: Each sidecar's metrics ``host:port`` (it listens on its pod's own loopback address).
    sidecar_metrics: list[str]
    #: The decode servers' own ports (for their NIXL counters).
    decoders: list[int] = dataclasses.field(default_factory=list)
    #: The prefill servers' ``host:port`` (how evenly they shared the prefill legs).
    prefillers: list[str] = dataclasses.field(default_factory=list)


def _wait_pool(port: int, size: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"epp exited: {_tail(log)}")
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/pool", timeout=2) as r:
                eps = orjson.loads(r.read()).get("endpoints", [])
            if sum(1 for ep in eps if ep.get("age_seconds") is not None) >= size:
                return
        time.sleep(0.2)
    raise TimeoutError(f"epp not ready: {_tail(log)}")


@contextlib.contextmanager
def start(kind: str, workdir: Path, seed: int, threshold: int, time_scale: float = 1.0,
          split: tuple[int, int] = (2, 2), pd_config: str = "llm-d",
          profile: str = "8b-h100") -> Iterator[Fleet]:
    """Start one fleet (``KINDS``). ``split``: prefill and decode servers of the P/D fleets
    (the aggregated fleet has as many servers in all); ``profile``: every server's
    simulator profile (``sim/profiles.py``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = e.free_port()
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "link": "rdma"}
    servers: list[dict[str, Any]] = []
    sidecars: list[tuple[str, int, int]] = []  # (ip, decoder port, metrics port)
    n_prefill, n_decode = split
    if kind == "aggregated":
        ips = [f"127.0.11.{i + 1}" for i in range(n_prefill + n_decode)]
        servers = [{"host": ip, "port": port, "name": f"agg-{i}"} for i, ip in enumerate(ips)]
        pods = [_pod(f"agg-{i}", ip, None) for i, ip in enumerate(ips)]
    else:
        ips = [f"127.0.12.{i + 1}" for i in range(n_prefill + n_decode)]
        pods = []
        for i, ip in enumerate(ips[:n_decode]):  # decode pods: sidecar on the pool port
            decoder = e.free_port()
            servers.append({"host": "127.0.0.1", "port": decoder, "name": f"decode-{i}",
                            "kv_transfer_config": kv})
            if kind == "pd":
                sidecars.append((ip, decoder, e.free_port()))
            pods.append(_pod(f"decode-{i}", ip, "decode"))
        for i, ip in enumerate(ips[n_decode:]):
            servers.append({"host": ip, "port": port, "name": f"prefill-{i}",
                            "kv_transfer_config": kv})
            pods.append(_pod(f"prefill-{i}", ip, "prefill"))
    fleet_file = workdir / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump({
        "defaults": {"profile": profile, "seed": seed, "time_scale": time_scale},
        "servers": servers}))
    manifests = workdir / "pool.yaml"
    manifests.write_text(yaml.safe_dump_all(_pool(port, pods)))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sim = subprocess.Popen(
            [sys.executable, "-m", "sim.main", "--config", str(fleet_file), "--log-level",
             "warning"], stdout=subprocess.PIPE, stderr=(workdir / "sim.log").open("ab"))
        procs.append(sim)
        assert sim.stdout is not None
        if not sim.stdout.readline().startswith(b"vllm-sim ready:"):
            raise RuntimeError(f"simulator did not start: {_tail(workdir / 'sim.log')}")
        if kind == "vllm-router-pd":
            decoders = [f"http://127.0.0.1:{s['port']}" for s in servers[:n_decode]]
            prefillers = [f"http://{s['host']}:{s['port']}" for s in servers[n_decode:]]
            fleet = _vllm_router_pd(procs, workdir, prefillers, decoders)
            fleet.prefillers = [u.removeprefix("http://") for u in prefillers]
            yield fleet
            return
        for i, (ip, decoder, metrics) in enumerate(sidecars):
            procs.append(_popen([sys.executable, "-m", "sidecar.main", "--host", ip,
                                 "--port", str(port), "--vllm-port", str(decoder),
                                 "--manifests", str(manifests), "--metrics-port", str(metrics)],
                                workdir / f"sidecar-{i}.log"))
        grpc, health, metrics_port = e.free_port(), e.free_port(), e.free_port()
        cmd = [sys.executable, "-m", "epp.main", "--manifests", str(manifests),
               "--secure-serving=false", "--grpc-port", str(grpc), "--grpc-health-port",
               str(health), "--metrics-port", str(metrics_port), "--grace-period", "2"]
        if kind == "pd":
            (workdir / "epp-config.yaml").write_text(PD_CONFIGS[pd_config] % threshold)
            cmd += ["--config-file", str(workdir / "epp-config.yaml")]
        epp = _popen(cmd, workdir / "epp.log")
        procs.append(epp)
        _wait_pool(metrics_port, len(ips), epp, workdir / "epp.log")
        admin, listen = e.free_port(), e.free_port()
        # The decider's decode pick is the destination (the sidecar on the pool port).
        endpoints = [f"{ip}:{port}" for ip in ips]
        with e.Envoy(pool_gateway_config(grpc, admin, listen, endpoints), admin_port=admin,
                     workdir=workdir / "envoy"):
            yield Fleet(procs, f"http://127.0.0.1:{listen}", metrics_port,
                        [f"{ip}:{m}" for ip, _, m in sidecars],
                        [s["port"] for s in servers[:n_decode]] if kind == "pd" else [],
                        [f"{s['host']}:{s['port']}" for s in servers[n_decode:]]
                        if kind == "pd" else [])
    finally:
        for p in reversed(procs):
            _stop(p)


def _vllm_router_pd(procs: list[subprocess.Popen[bytes]], workdir: Path,
                    prefillers: list[str], decoders: list[str]) -> Fleet:
    """Start vllm-router in PD mode over the simulated servers (added to ``procs``)."""
    peer = PEERS["vllm-router"]
    port, prom = e.free_port(), e.free_port()
    cmd = [str(peer.python), "-m", peer.module, "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-port", str(prom), "--vllm-pd-disaggregation", "--kv-connector", "nixl",
           "--policy", "cache_aware"]
    for url in prefillers:
        cmd += ["--prefill", url]
    for url in decoders:
        cmd += ["--decode", url]
    (workdir / "command.txt").write_text(" ".join(cmd) + "\n")
    log = workdir / "vllm-router.log"
    proc = _popen(cmd, log, env=peer_env())
    procs.append(proc)
    wait_router_ready(proc, port, "vllm-router", log)
    return Fleet(procs, f"http://127.0.0.1:{port}", 0, [],
                 [int(u.rsplit(":", 1)[1]) for u in decoders])


def _scrape(port: int | str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric family on a Prometheus endpoint (a port on
    127.0.0.1, or ``host:port``)."""
    where = port if isinstance(port, str) else f"127.0.0.1:{port}"
    with urllib.request.urlopen(f"http://{where}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, value = line.rsplit(" ", 1)
            out[key[len(name):]] = out.get(key[len(name):], 0.0) + float(value)
    return out


# -- one run, the summary -----------------------------------------------------------------

def summarize(outcomes: list[Outcome], tags: list[str],
              time_scale: float = 1.0) -> dict[str, dict[str, float]]:
    """Per class (``all``, ``long``, ``short``): TTFT/TPOT p50 and p90, tok/s, errors; in
    model seconds (wall seconds / ``time_scale``)."""
    out: dict[str, dict[str, float]] = {}
    ok_all = [o for o in outcomes if o.ok]
    first = min((o.start for o in outcomes), default=0.0)
    last = max((o.start + (o.e2e or 0.0) for o in ok_all), default=first + 1e-9)
    span = max(1e-9, last - first) / time_scale
    for cls in ("all", "long", "short"):
        sel = [o for o, t in zip(outcomes, tags, strict=True) if cls in ("all", t)]
        ok = [o for o in sel if o.ok]
        ttft = [o.ttft / time_scale for o in ok if o.ttft is not None]
        tpot = [t / time_scale for o in ok if (t := o.tpot) is not None]
        out[cls] = {"requests": len(sel), "errors": len(sel) - len(ok),
                    "ttft_p50": pct(ttft, .5), "ttft_p90": pct(ttft, .9),
                    "tpot_p50": pct(tpot, .5), "tpot_p90": pct(tpot, .9),
                    "output_tps": sum(o.output_tokens for o in ok) / span}
    return out


def run(kind: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    workdir = args.workdir / f"{kind}-seed{seed}"
    specs = [dataclasses.replace(s, at=s.at * args.time_scale)
             for s in workload(seed, args.rate, args.duration)]
    workdir.mkdir(parents=True, exist_ok=True)
    write_specs(specs, workdir / "requests.jsonl")
    split = parse_split(args.split)
    with start(kind, workdir, seed, args.threshold, args.time_scale, split,
               args.pd_config) as fleet:
        subprocess.run([sys.executable, "-m", "bench.openloop", "--url", fleet.url,
                        "--requests", str(workdir / "requests.jsonl"),
                        "--out", str(workdir / "outcomes.jsonl"), "--timeout", "300"],
                       check=True)
        counters: dict[str, Any] = {}
        if kind == "pd":
            counters["decisions"] = _scrape(
                fleet.epp_metrics, "llm_d_inference_scheduler_disagg_decision_total")
            modes: dict[str, float] = {}
            per_pod = [_scrape(port, "pd_sidecar_requests_total")
                       for port in fleet.sidecar_metrics]
            for pod in per_pod:
                for k, v in pod.items():
                    modes[k] = modes.get(k, 0.0) + v
            counters["sidecar"] = modes
            counters["sidecar_per_pod"] = per_pod
        # How evenly the decode servers shared the requests (vLLM's finished-request count).
        counters["decoder_requests"] = [
            sum(_scrape(port, "vllm:request_success_total").values()) for port in fleet.decoders]
        counters["prefiller_requests"] = [
            sum(_scrape(where, "vllm:request_success_total").values())
            for where in fleet.prefillers]
        for name, key in (("vllm:nixl_xfer_time_seconds_count", "kv_pulls"),
                          ("vllm:nixl_num_failed_transfers_total", "failed_pulls")):
            counters[key] = sum(sum(_scrape(port, name).values()) for port in fleet.decoders)
    outcomes = [Outcome(**orjson.loads(line))
                for line in (workdir / "outcomes.jsonl").read_bytes().splitlines()]
    summary = summarize(outcomes, [s.tag for s in specs], args.time_scale)
    result = {"kind": kind, "seed": seed, "summary": summary, "counters": counters,
              "settings": settings(args)}
    (workdir / "summary.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return result


def parse_split(text: str) -> tuple[int, int]:
    """``"P:D"`` -> (prefill servers, decode servers), each at least 1."""
    p, sep, d = text.partition(":")
    if not (sep and p.isdigit() and d.isdigit() and int(p) >= 1 and int(d) >= 1):
        raise ValueError(f"--split: expected PREFILL:DECODE with both >= 1, got {text!r}")
    return int(p), int(d)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a run's figures depend on besides the seed (kept with each result)."""
    return {"rate": args.rate, "duration": args.duration, "time_scale": args.time_scale,
            "threshold": args.threshold, "split": args.split, "pd_config": args.pd_config}


def seed_range(args: argparse.Namespace) -> range:
    """The seeds of this run: ``--seeds`` of them from ``--first-seed``."""
    return range(args.first_seed, args.first_seed + args.seeds)


def ratio_interval(ratios: list[float]) -> tuple[float, float]:
    """95 % t-interval of the geometric mean of paired ratios."""
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < 2:
        return (math.nan, math.nan)
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = T95.get(len(logs) - 1, 1.96) * sd / math.sqrt(len(logs))
    return math.exp(mean - half), math.exp(mean + half)


def verdict(lo: float, hi: float, bound: float, sense: str) -> str:
    if math.isnan(lo):
        return "inconclusive"
    good, bad = (hi <= bound, lo > bound) if sense == "le" else (lo >= bound, hi < bound)
    return "met" if good else "not met" if bad else "inconclusive"


def _ratios(by: dict[tuple[str, int], Any], seeds: list[int], kind: str, base: str,
            cls: str, metric: str) -> list[float]:
    """``kind / base`` of one figure, per seed that has both and a positive base."""
    return [by[kind, s][cls][metric] / by[base, s][cls][metric] for s in seeds
            if (kind, s) in by and (base, s) in by and by[base, s][cls][metric] > 0]


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    by = {(r["kind"], r["seed"]): r["summary"] for r in results}
    kinds = [k for k in KINDS if any(r["kind"] == k for r in results)]
    # Only seeds every fleet completed, so every ratio is paired on the same seeds.
    seeds = sorted(s for s in {r["seed"] for r in results} if all((k, s) in by for k in kinds))
    others = [k for k in kinds if k != "aggregated"]
    pairs = [(k, "aggregated") for k in others]
    if "vllm-router-pd" in kinds:
        pairs.append(("pd", "vllm-router-pd"))
    head = " | ".join(f"{k} (median)" for k in kinds)
    ratio_head = " | ".join(f"{a}/{b} median [95% CI]" for a, b in pairs)
    lines = [f"seeds {seeds}, {args.rate:g} req/s for {args.duration:g} s per run, "
             f"nonCachedTokens {args.threshold}, time scale {args.time_scale:g}, "
             f"P:D {args.split}, pd config {args.pd_config}"
             + (f", aggregated runs from {args.baseline}" if args.baseline else ""), "",
             f"| class | metric | {head} | {ratio_head} | target | verdict pd/agg |"
             + (" verdict vllm-router-pd/agg |" if "vllm-router-pd" in kinds else ""),
             "|---|---|" + "---|" * (len(kinds) + len(pairs) + 2
                                     + ("vllm-router-pd" in kinds))]
    for cls in ("all", "long", "short"):
        for metric in ("ttft_p90", "tpot_p90", "output_tps", "ttft_p50", "tpot_p50"):
            unit = (lambda x: f"{x:.1f}") if metric == "output_tps" else (
                lambda x: f"{x * 1000:.0f} ms")
            cells = [unit(statistics.median(by[k, s][cls][metric] for s in seeds))
                     for k in kinds]
            intervals = {}
            for a, b in pairs:
                ratios = _ratios(by, seeds, a, b, cls, metric)
                lo, hi = ratio_interval(ratios)
                intervals[a, b] = (lo, hi)
                mid = f"{statistics.median(ratios):.2f}" if ratios else "n/a"
                cells.append(f"{mid} [{lo:.2f}, {hi:.2f}]")
            target, verdicts = "", [""] * (1 + ("vllm-router-pd" in kinds))
            if cls == "long" and metric in TARGETS:
                bound, sense = TARGETS[metric]
                target = f"{'≤' if sense == 'le' else '≥'} {bound}"
                verdicts = [verdict(*intervals[k, "aggregated"], bound, sense)
                            for k in others]
            lines.append(f"| {cls} | {metric} | " + " | ".join(cells)
                         + f" | {target} | " + " | ".join(verdicts) + " |")
    errors = {k: sum(by[k, s]["all"]["errors"] for s in seeds) for k in kinds}
    lines += ["", f"errors: {errors}"]
    for r in results:
        if r["kind"] != "aggregated" and r["seed"] in seeds:
            c = r["counters"]
            lines.append(f"seed {r['seed']} {r['kind']}: EPP decisions {c.get('decisions')}, "
                         f"sidecars {c.get('sidecar')}, KV pulls {c.get('kv_pulls')} "
                         f"(failed {c.get('failed_pulls')}), requests per decode server "
                         f"{c.get('decoder_requests')}, per prefill server "
                         f"{c.get('prefiller_requests')}")
    return "\n".join(lines)


def baseline(args: argparse.Namespace, p: argparse.ArgumentParser,
             servers: int) -> list[dict[str, Any]]:
    """The aggregated results of ``--baseline`` for this run's seeds; a one-line error when
    the file is missing, lacks a seed or ran other settings."""
    try:
        earlier = orjson.loads(args.baseline.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        p.error(f"--baseline {args.baseline}: {exc}")
    agg = {r["seed"]: r for r in earlier if r["kind"] == "aggregated"}
    seeds = seed_range(args)
    if missing := [s for s in seeds if s not in agg]:
        p.error(f"--baseline {args.baseline}: no aggregated run for seed(s) {missing}")
    mine = settings(args)
    for seed in seeds:
        theirs = agg[seed].get("settings", {})
        for key in ("rate", "duration", "time_scale"):
            if theirs.get(key) != mine[key]:
                p.error(f"--baseline {args.baseline}: seed {seed} ran {key} "
                        f"{theirs.get(key)}, this run {mine[key]}")
        if sum(parse_split(theirs.get("split", "2:2"))) != servers:
            p.error(f"--baseline {args.baseline}: seed {seed} ran another number of servers")
    return [agg[s] for s in seeds]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pd_compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0,
                   help="seeds run are FIRST_SEED .. FIRST_SEED+SEEDS-1 (to add seeds to an "
                   "earlier run; --report-only on the merged results.json)")
    p.add_argument("--rate", type=float, default=0.6, help="requests per second")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--threshold", type=int, default=1024, help="nonCachedTokens of the decider")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="the simulator runs this many times slower than the model (less "
                   "weight for the machine's own overheads); results are in model seconds")
    p.add_argument("--split", default="2:2", help="PREFILL:DECODE servers of the P/D fleets "
                   "(the aggregated fleet has their sum)")
    p.add_argument("--pd-config", default="llm-d", choices=sorted(PD_CONFIGS),
                   help="the pd fleet's EPP scorers (see PD_CONFIGS)")
    p.add_argument("--baseline", type=Path, help="results.json of an earlier run: its "
                   "aggregated runs (same settings, same seeds) are reused, not run again")
    p.add_argument("--fleets", default=",".join(KINDS),
                   help=f"comma-separated subset of {', '.join(KINDS)} (aggregated is always "
                   "run, unless --baseline gives it)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/pd_compare"))
    p.add_argument("--report-only", action="store_true",
                   help="print the report of WORKDIR/results.json (e.g. of an interrupted run)")
    args = p.parse_args(argv)
    if args.report_only:
        print(report(orjson.loads((args.workdir / "results.json").read_bytes()), args))
        return
    wanted = set(args.fleets.split(",")) | {"aggregated"}
    if unknown := wanted - set(KINDS):
        p.error(f"--fleets: unknown fleet(s) {', '.join(sorted(unknown))}")
    if "vllm-router-pd" in wanted and not PEERS["vllm-router"].installed():
        print("vllm-router-pd skipped: vllm-router not installed "
              "(run `python -m bench.peers install`)", flush=True)
        wanted.discard("vllm-router-pd")
    try:
        split = parse_split(args.split)
    except ValueError as exc:
        p.error(str(exc))
    results = []
    if args.baseline:
        results = baseline(args, p, sum(split))
        wanted.discard("aggregated")
    kinds = [k for k in KINDS if k in wanted]
    args.workdir.mkdir(parents=True, exist_ok=True)
    for seed in seed_range(args):
        for kind in kinds:
            t0 = time.monotonic()
            load = os.getloadavg()[0]
            results.append(run(kind, seed, args))
            s = results[-1]["summary"]["all"]
            print(f"seed {seed} {kind:14s} ttft_p90 {s['ttft_p90']:.3f}s tpot_p90 "
                  f"{s['tpot_p90'] * 1000:.1f}ms tok/s {s['output_tps']:.1f} errors "
                  f"{s['errors']} ({time.monotonic() - t0:.0f}s, load {load:.1f} at start)",
                  flush=True)
            # Written after every run: an interrupted benchmark keeps its finished seeds.
            (args.workdir / "results.json").write_bytes(orjson.dumps(results))
    print(report(results, args))


if __name__ == "__main__":
    main()
