"""The real-time P/D fleets a scenario with ``fleet.roles`` plays (``bench/scenarios/pd.yaml``):
every run starts from nothing on loopback, one ``sim.main`` process serving all servers.

- **aggregated**: ``P + D`` servers behind Envoy + our EPP with its default config;
- **pd**: ``P`` prefill + ``D`` decode servers (NixlConnector, ``rdma`` link) labelled
  ``llm-d.ai/role``, a ``pd-sidecar`` in front of each decode server, Envoy + our EPP with one
  of the configs of :func:`pd_config` (the decider's ``nonCachedTokens`` set per variant);
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
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.contenders import (
    Contender,
    Epp,
    SimFleet,
    _popen,
    _stop,
    launch_sim,
    wait_router_ready,
)
from bench.peers import PEERS, peer_env
from devkit import envoy as e
from devkit.manifests import pool_manifests
from modelserver.pd import ROLE_LABEL

#: The ``pd`` fleet's EPP configs (a scenario's ``pd: {config: NAME}``) are data:
#: ``bench/scenarios/configs/pd-NAME.yaml``, each file saying what it is.
CONFIGS = Path(__file__).resolve().parent / "scenarios" / "configs"


def pd_config(name: str, threshold: int) -> str:
    """The ``pd`` fleet's EPP config ``name`` with its decider's ``nonCachedTokens`` at
    ``threshold``."""
    doc = yaml.safe_load((CONFIGS / f"pd-{name}.yaml").read_text())
    for plugin in doc["plugins"]:
        if plugin["type"].endswith("-pd-decider"):
            plugin["parameters"]["nonCachedTokens"] = threshold
    return str(yaml.safe_dump(doc, sort_keys=False))


# -- the fleets -----------------------------------------------------------------------------

@dataclass
class Fleet:
    """What one run started: where the client goes, and where to read the counters
    afterwards."""

    url: str
    #: Each sidecar's metrics ``host:port`` (it listens on its pod's own loopback address).
    sidecar_metrics: list[str]
    #: The decode servers' own ports (for their NIXL counters).
    decoders: list[int]


@contextlib.contextmanager
def start(kind: str, workdir: Path, seed: int, threshold: int, time_scale: float = 1.0,
          split: tuple[int, int] = (2, 2), config: str = "llm-d",
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
    manifests = workdir / "pool.yaml"
    docs = pool_manifests("sims", [(name, ip) for name, ip, _ in pods], port)
    for doc, (_, _, role) in zip(docs[1:], pods, strict=True):
        if role:
            doc["metadata"]["labels"][ROLE_LABEL] = role
    manifests.write_text(yaml.safe_dump_all(docs))
    procs: list[subprocess.Popen[Any]] = []
    try:
        procs.append(launch_sim(workdir, {
            "defaults": {"profile": profile, "seed": seed, "time_scale": time_scale},
            "servers": servers}))
        if kind == "vllm-router-pd":
            decoders = [f"http://127.0.0.1:{s['port']}" for s in servers[:n_decode]]
            prefillers = [f"http://{s['host']}:{s['port']}" for s in servers[n_decode:]]
            yield _vllm_router_pd(procs, workdir, prefillers, decoders)
            return
        for i, (ip, decoder, metrics) in enumerate(sidecars):
            procs.append(_popen([sys.executable, "-m", "sidecar.main", "--host", ip,
                                 "--port", str(port), "--vllm-port", str(decoder),
                                 "--manifests", str(manifests), "--metrics-port", str(metrics)],
                                workdir / f"sidecar-{i}.log"))
        epp = Epp(kind, pd_config(config, threshold) if kind == "pd" else None)
        # The decider's decode pick is the destination (the sidecar on the pool port).
        with epp.serve(manifests, [f"{ip}:{port}" for ip in ips], workdir) as url:
            yield Fleet(url, [f"{ip}:{m}" for ip, _, m in sidecars],
                        [s["port"] for s in servers[:n_decode]] if kind == "pd" else [])
    finally:
        for p in reversed(procs):
            _stop(p)


def _vllm_router_pd(procs: list[subprocess.Popen[Any]], workdir: Path,
                    prefillers: list[str], decoders: list[str]) -> Fleet:
    """Start vllm-router in PD mode over the simulated servers (added to ``procs``)."""
    port = e.free_port()
    cmd = PEERS["vllm-router"].command(
        policy="cache_aware", port=port, prometheus_port=e.free_port(),
        workers=["--vllm-pd-disaggregation", "--kv-connector", "nixl",
                 *(f for url in prefillers for f in ("--prefill", url)),
                 *(f for url in decoders for f in ("--decode", url))])
    (workdir / "command.txt").write_text(" ".join(cmd) + "\n")
    log = workdir / "vllm-router.log"
    proc = _popen(cmd, log, env=peer_env())
    procs.append(proc)
    wait_router_ready(proc, port, "vllm-router", log)
    return Fleet(f"http://127.0.0.1:{port}", [], [int(u.rsplit(":", 1)[1]) for u in decoders])


class PdRouter(Contender):
    """One of :func:`start`'s fleets as a contender of ``bench.runner.run_one``: ``fleet``
    (``aggregated``, ``pd`` or ``vllm-router-pd``) over ``roles`` servers, ``threshold``
    and ``config``: the ``pd`` fleet's decider and :func:`pd_config` name."""

    own_fleet = True

    def __init__(self, name: str, kind: str, fleet: str, roles: dict[str, int],
                 threshold: int = 1024, config: str = "llm-d") -> None:
        self.name, self.kind, self.fleet, self.roles = name, kind, fleet, roles
        self.threshold, self.config = threshold, config

    def unavailable(self) -> str | None:
        return PEERS["vllm-router"].problem() if self.fleet == "vllm-router-pd" else None

    @contextlib.contextmanager
    def running(self, fleet: SimFleet, workdir: Path) -> Iterator[str]:
        with start(self.fleet, workdir, fleet.seed, self.threshold, fleet.time_scale,
                   (self.roles["prefill"], self.roles["decode"]), self.config,
                   fleet.profile) as pd:
            yield pd.url
