"""The real-time P/D fleets a scenario with ``fleet.roles`` plays (``bench/scenarios/pd.yaml``):
every run starts from nothing on loopback, one ``sim.main`` process serving all servers.

- **aggregated**: ``P + D`` servers behind Envoy + our EPP with its default config;
- **pd**: ``P`` prefill + ``D`` decode servers (NixlConnector, ``rdma`` link) labelled
  ``llm-d.ai/role``, a ``pd-sidecar`` in front of each decode server, Envoy + our EPP with one
  of :data:`PD_CONFIGS` (``%d`` in it is the decider's ``nonCachedTokens``);
- **vllm-router-pd**: the same servers (no sidecars, Envoy or EPP) behind vllm-router's PD
  mode (``--vllm-pd-disaggregation --kv-connector nixl``, ``cache_aware`` on both sides): it
  sends the prefill leg (``max_tokens: 1``, ``do_remote_decode``), then the decode leg with the
  returned ``kv_transfer_params``, which the simulator's NixlConnector roles speak. It
  disaggregates every request.

sglang-router's PD mode is not a contender: it sends the request to both servers at once with
SGLang's bootstrap fields, which vLLM ignores, so no KV moves (docs/pd.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.contenders import (
    _popen,
    _stop,
    _tail,
    pool_gateway_config,
    wait_pool_ready,
    wait_router_ready,
)
from bench.peers import PEERS, peer_env
from devkit import envoy as e
from devkit.manifests import pool_manifests
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


# -- the fleets -----------------------------------------------------------------------------

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
    pods: list[tuple[str, str, str]] = []      # (name, ip, role)
    n_prefill, n_decode = split
    if kind == "aggregated":
        ips = [f"127.0.11.{i + 1}" for i in range(n_prefill + n_decode)]
        servers = [{"host": ip, "port": port, "name": f"agg-{i}"} for i, ip in enumerate(ips)]
        pods = [(f"agg-{i}", ip, "") for i, ip in enumerate(ips)]
    else:
        ips = [f"127.0.12.{i + 1}" for i in range(n_prefill + n_decode)]
        for i, ip in enumerate(ips[:n_decode]):  # decode pods: sidecar on the pool port
            decoder = e.free_port()
            servers.append({"host": "127.0.0.1", "port": decoder, "name": f"decode-{i}",
                            "kv_transfer_config": kv})
            if kind == "pd":
                sidecars.append((ip, decoder, e.free_port()))
            pods.append((f"decode-{i}", ip, "decode"))
        for i, ip in enumerate(ips[n_decode:]):
            servers.append({"host": ip, "port": port, "name": f"prefill-{i}",
                            "kv_transfer_config": kv})
            pods.append((f"prefill-{i}", ip, "prefill"))
    fleet_file = workdir / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump({
        "defaults": {"profile": profile, "seed": seed, "time_scale": time_scale},
        "servers": servers}))
    manifests = workdir / "pool.yaml"
    docs = pool_manifests("sims", [(name, ip) for name, ip, _ in pods], port)
    for doc, (_, _, role) in zip(docs[1:], pods, strict=True):
        if role:
            doc["metadata"]["labels"][ROLE_LABEL] = role
    manifests.write_text(yaml.safe_dump_all(docs))
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
        wait_pool_ready(epp, metrics_port, len(ips), workdir / "epp.log", timeout=60)
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
