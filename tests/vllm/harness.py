"""Real vLLM servers and the real gateway in front of them, for ``make test-vllm``.

Two local vLLM servers (CPU build, the tiny model from ``make_model.py``) are enough to show
every behaviour the checks need, and each costs ~3 GiB of RAM and a share of two cores:

- ``lora`` (127.0.19.1): LoRA enabled (2 slots), adapter ``a1`` loaded at start; prefix
  caching; ``--max-num-seqs 4`` so a burst builds a waiting queue.
- ``small`` (127.0.19.2): no LoRA; a 40-block KV cache of 32-token blocks (vLLM keeps one
  block back, so 1,248 tokens) with ``--max-model-len 1024`` so a few prompts evict;
  ``--max-num-seqs 4``; publishes KV events over ZMQ on a local ``ipc://`` socket it binds
  (vLLM binds wildcard and ipc endpoints and connects to others; ipc keeps it off the
  network while any number of subscribers connect).

Both run ``--prefix-caching-hash-algo sha256_cbor`` without ``PYTHONHASHSEED``, so their
block hashes are reproducible outside vLLM (the simulator's ``BlockHasher`` does; the
default ``sha256`` pickles Python objects, which only Python can reproduce).

Both listen on the same port, like the pods of one InferencePool. With ``--vllm-url`` the
same gateway is put in front of servers the user already runs instead (see
``docs/real-vllm.md``).

The P/D check starts a second pair (:func:`pd_servers`) with vLLM's shared-storage KV
connector: a prefiller (127.0.19.3) and a decoder (127.0.19.4, behind a ``pd-sidecar`` in
``shared-storage`` mode on the pool's port), with a gateway of their own whose EPP runs
llm-d's P/D profile (:class:`PDPool`).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from devkit.topology import Pool, Topology
from modelserver.pd import ROLE_LABEL

MODEL = "tiny"
#: vLLM 0.32's shared-storage KV connector (``vllm/distributed/kv_transfer/kv_connector/v1/
#: example_connector.py``; it was ``SharedStorageConnector`` before): KV of a prompt's
#: block-aligned tokens goes to safetensors files under ``shared_storage_path``, one folder
#: per prompt named by a hash of those tokens.
SHARED_STORAGE_CONNECTOR = "ExampleConnector"
#: llm-d's P/D EndpointPickerConfig for simulators (decode profile, then prefill when at least
#: 16 prompt tokens are not cached on the decode pod), as the Envoy P/D test uses it.
PD_EPP_CONFIG = Path(__file__).resolve().parents[1] / "epp/data/llm-d-sim-pd-epp-config.yaml"
#: ``--prefix-caching-hash-algo`` of the local servers.
HASH_ALGO = "sha256_cbor"
POOL = "real"
#: Generous: vLLM takes ~35 s alone here, several minutes while other work shares the cores.
STARTUP_TIMEOUT = 900.0


@dataclass
class VllmServer:
    """One model server the gateway routes to (started here or given by URL)."""

    name: str
    host: str
    port: int
    #: What this server was started with (empty for ``--vllm-url`` servers).
    features: frozenset[str] = frozenset()
    #: ZMQ address the server's KV-event PUB socket binds (local servers only).
    kv_events_address: str | None = None
    #: Folder of the shared-storage KV connector (P/D servers only).
    kv_shared_dir: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def key(self) -> str:
        return f"{self.host}:{self.port}"

    def get(self, path: str, timeout: float = 10) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.read().decode()

    def log_tail(self, n: int = 15) -> str:
        if self.log is None:
            return ""
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def vllm_command(venv: Path, model_dir: Path, server: VllmServer) -> list[str]:
    """``vllm serve`` of the tiny model with the flags issue #19 found to work on CPU."""
    args = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.cli.main", "serve",
            str(model_dir / "base"), "--served-model-name", MODEL,
            "--host", server.host, "--port", str(server.port),
            "--enable-prefix-caching", "--dtype", "float32", "--enforce-eager",
            "--max-num-seqs", "4", "--disable-uvicorn-access-log",
            # usage.prompt_tokens_details.cached_tokens, as the simulator always sends it
            "--enable-prompt-tokens-details",
            # block hashes anyone can reproduce (CBOR, not pickle): the precise-index check
            "--prefix-caching-hash-algo", HASH_ALGO]
    if "lora" in server.features:
        args += ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
                 "--lora-modules", f"a1={model_dir / 'a1'}"]
    if "small-kv" in server.features:
        # vLLM refuses to start unless one max-length request fits the cache.
        args += ["--block-size", "32", "--num-gpu-blocks-override", "40",
                 "--max-model-len", "1024"]
    else:
        args += ["--max-model-len", "2048"]
    if server.kv_events_address is not None:
        args += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": server.kv_events_address, "topic": "kv-events"})]
    if server.kv_shared_dir is not None:
        # kv_both: each server writes the KV of prompts it computes and reads the KV of
        # prompts it finds in the folder, whichever role the EPP gives it.
        args += ["--kv-transfer-config", json.dumps({
            "kv_connector": SHARED_STORAGE_CONNECTOR, "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(server.kv_shared_dir)}})]
    return args


def local_servers() -> list[VllmServer]:
    """The two local servers (see the module docstring), on one free port."""
    port = e.free_port()
    return [
        VllmServer("lora", "127.0.19.1", port, frozenset({"lora"})),
        VllmServer("small", "127.0.19.2", port, frozenset({"small-kv", "kv-events"}),
                   kv_events_address=f"ipc://{tempfile.mkdtemp(prefix='vllm-kv-')}/events"),
    ]


def pd_servers(port: int, shared_dir: Path) -> list[VllmServer]:
    """The P/D pair: the prefiller on the pool's ``port``, the decoder's vLLM on another port
    of its own IP (the pool's port there is its sidecar's); one shared KV folder."""
    return [
        VllmServer("pd-prefill", "127.0.19.3", port, frozenset({"kv-shared-storage"}),
                   kv_shared_dir=shared_dir),
        VllmServer("pd-decode", "127.0.19.4", e.free_port(), frozenset({"kv-shared-storage"}),
                   kv_shared_dir=shared_dir),
    ]


def start_vllm(venv: Path, model_dir: Path, servers: list[VllmServer], logs: Path) -> None:
    """Start every server at once and wait until all answer ``/health``."""
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "PYTHONUNBUFFERED": "1",
           # "auto" pins every server's engine to core 0; let the kernel spread them.
           "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    # vLLM seeds its first block hash with PYTHONHASHSEED when set, else with a fixed string
    # for sha256_cbor: the precise-index check reproduces the hashes from the fixed string.
    env.pop("PYTHONHASHSEED", None)
    for s in servers:
        s.log = logs / f"vllm-{s.name}.log"
        with s.log.open("wb") as out:
            s.proc = subprocess.Popen(vllm_command(venv, model_dir, s), stdout=out,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env, start_new_session=True)
    wait_healthy(servers, STARTUP_TIMEOUT)


def wait_healthy(servers: list[VllmServer], timeout: float) -> None:
    """Every server answers ``/health`` 200; a server that exits fails at once."""
    pending = list(servers)
    deadline = time.monotonic() + timeout
    while pending:
        for s in list(pending):
            if s.proc is not None and s.proc.poll() is not None:
                raise RuntimeError(f"vLLM {s.name} exited {s.proc.returncode}:\n{s.log_tail()}")
            try:
                s.get("/health", timeout=2)
                pending.remove(s)
            except OSError:
                pass
        if pending and time.monotonic() > deadline:
            names = ", ".join(s.name for s in pending)
            raise TimeoutError(f"vLLM not healthy after {timeout:.0f}s: {names}\n"
                               + "\n".join(s.log_tail() for s in pending))
        time.sleep(1)


def stop_vllm(servers: list[VllmServer]) -> None:
    """SIGTERM each server's process group (vLLM forks an engine process), then SIGKILL."""
    for s in servers:
        if s.proc is not None and s.proc.poll() is None:
            os.killpg(s.proc.pid, signal.SIGTERM)
    for s in servers:
        if s.proc is None:
            continue
        try:
            s.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(s.proc.pid, signal.SIGKILL)
            s.proc.wait()


def servers_from_urls(urls: list[str]) -> list[VllmServer]:
    """``--vllm-url`` values → servers; all must share one port (an InferencePool's
    ``targetPorts``), and host names are resolved to the IP the EPP's Pods need."""
    servers = []
    for i, raw in enumerate(urls):
        u = urllib.parse.urlsplit(raw if "://" in raw else f"http://{raw}")
        if u.scheme != "http" or not u.hostname or u.path not in ("", "/"):
            raise ValueError(f"--vllm-url {raw!r}: expected http://HOST:PORT")
        ip = socket.gethostbyname(u.hostname)
        servers.append(VllmServer(f"server-{i}", ip, u.port or 80))
    if len({s.port for s in servers}) != 1:
        raise ValueError("--vllm-url: every server must listen on the same port "
                         "(one InferencePool target port)")
    return servers


def served_models(server: VllmServer) -> tuple[str, list[str]]:
    """(base model, LoRA adapters) from the server's ``/v1/models``."""
    data = json.loads(server.get("/v1/models"))["data"]
    base = [m["id"] for m in data if not m.get("parent")]
    adapters = [m["id"] for m in data if m.get("parent")]
    if len(base) != 1:
        raise ValueError(f"{server.url}/v1/models: expected one base model, got {base}")
    return base[0], adapters


# --- the gateway ---------------------------------------------------------------------------

#: The saturation detector's thresholds in :data:`EPP_CONFIG` (the flow-control check computes
#: the pool's saturation from vLLM's /metrics with them).
EPP_SATURATION = {"queueDepthThreshold": 2, "kvCacheUtilThreshold": 0.95}
EPP_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: lora-affinity-scorer
    weight: 4
saturationDetector:
  queueDepthThreshold: {queueDepthThreshold}
  kvCacheUtilThreshold: {kvCacheUtilThreshold}
  metricsStalenessThreshold: 10s
""".format(**EPP_SATURATION)

#: :data:`EPP_CONFIG` with flow control on: critical (``chat``, priority 1) and sheddable
#: (``batch``, -1) bands; the sheddable band holds at most :data:`SHEDDABLE_QUEUE` requests,
#: more get 429. No TTL: a queued request waits until the pool has room.
SHEDDABLE_QUEUE = 4
FLOW_CONTROL_CONFIG = EPP_CONFIG + f"""
featureGates: [flowControl]
flowControl:
  priorityBands:
  - priority: 1
  - priority: -1
    maxRequests: {SHEDDABLE_QUEUE}
"""


@dataclass
class Gateway:
    """Envoy + BBR + EPP (TLS between Envoy and both, the services' default) on loopback."""

    workdir: Path
    servers: list[VllmServer]
    model: str
    adapters: list[str]
    #: The EPP's EndpointPickerConfig (:data:`EPP_CONFIG` or :data:`FLOW_CONTROL_CONFIG`).
    epp_config: str = EPP_CONFIG
    #: ``llm-d.ai/role`` label per server name (P/D pools); no label otherwise.
    roles: dict[str, str] = field(default_factory=dict)
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    envoy: e.Envoy | None = None
    port: int = 0
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def manifests(self) -> Path:
        """The pool, its pods and objectives, as the EPP reads them (``--manifests``)."""
        return self.workdir / "pool.yaml"

    def epp_get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['epp_metrics']}{path}",
                                    timeout=10) as r:
            return r.read().decode()

    def start(self) -> Gateway:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for k in ("epp_grpc", "epp_health", "epp_metrics", "bbr_grpc", "bbr_health",
                  "bbr_metrics", "admin", "listen"):
            self.ports[k] = e.free_port()
        self.port = self.ports["listen"]
        rewrite = {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
            "kind": "InferenceModelRewrite",
            "metadata": {"name": "alias", "namespace": "default"},
            "spec": {"poolRef": {"name": POOL}, "rules": [{
                "matches": [{"model": {"type": "Exact", "value": "alias"}}],
                "targets": [{"modelRewrite": self.model, "weight": 1}]}]},
        }
        objectives = [
            {"apiVersion": "inference.networking.x-k8s.io/v1alpha2",
             "kind": "InferenceObjective", "metadata": {"name": name, "namespace": "default"},
             "spec": {"priority": priority, "poolRef": {"name": POOL}}}
            for name, priority in (("batch", -1), ("chat", 1))
        ]
        docs = pool_manifests(POOL, [(s.name, s.host) for s in self.servers],
                              self.servers[0].port, [rewrite, *objectives])
        for doc in docs:
            role = self.roles.get(doc["metadata"]["name"]) if doc["kind"] == "Pod" else None
            if role is not None:
                doc["metadata"]["labels"][ROLE_LABEL] = role
        write_yaml(self.manifests, docs)
        config = self.workdir / "epp.yaml"
        config.write_text(self.epp_config)
        py = sys.executable
        p = self.ports
        self._spawn("epp", [py, "-m", "epp.main", "--manifests", str(self.manifests),
                            "--pool-name", POOL, "--config-file", str(config),
                            "--grpc-port", str(p["epp_grpc"]),
                            "--grpc-health-port", str(p["epp_health"]),
                            "--metrics-port", str(p["epp_metrics"]),
                            "--refresh-metrics-interval", "100ms",
                            "--metrics-staleness-threshold", "10s", "--grace-period", "2"])
        self._spawn("bbr", [py, "-m", "bbr.main", "--streaming",
                            "--grpc-port", str(p["bbr_grpc"]),
                            "--grpc-health-port", str(p["bbr_health"]),
                            "--metrics-port", str(p["bbr_metrics"]), "--grace-period", "2"])
        self._wait_serving(60)
        self.envoy = e.Envoy(self.envoy_config(), admin_port=p["admin"],
                             workdir=self.workdir / "envoy").start()
        return self

    def envoy_config(self) -> dict[str, Any]:
        """Envoy as ``make run`` builds it (:func:`devkit.stack.envoy_config`'s topology: BBR,
        then the EPP, then an ``override_host`` cluster of the pool's endpoints, retrying down
        the EPP's fallbacks), with the real servers as the pool's endpoints."""
        return Topology(
            listen=self.port, admin=self.ports["admin"], bbr_port=self.ports["bbr_grpc"],
            tls=True,
            pools=[Pool(POOL, models=list(dict.fromkeys([self.model, *self.adapters, "alias"])),
                        epp_port=self.ports["epp_grpc"],
                        endpoints=[(s.host, s.port) for s in self.servers])],
            not_found="no pool serves this model", runtime=e.GRACEFUL_CLOSE,
        ).bootstrap()

    def _spawn(self, name: str, args: list[str]) -> None:
        with (self.workdir / f"{name}.log").open("wb") as out:
            self.children[name] = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def log_tail(self, name: str, n: int = 20) -> str:
        lines = (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def _wait_serving(self, timeout: float) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        def serving(name: str, port: int) -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                proc = self.children[name]
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}:\n"
                                       + self.log_tail(name))
                try:
                    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                        status = health_pb2_grpc.HealthStub(ch).Check(
                            health_pb2.HealthCheckRequest(), timeout=1).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
            raise TimeoutError(f"{name} not SERVING after {timeout:.0f}s:\n"
                               + self.log_tail(name))

        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            for f in [ex.submit(serving, "epp", self.ports["epp_health"]),
                      ex.submit(serving, "bbr", self.ports["bbr_health"])]:
                f.result()

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        for proc in self.children.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.children.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def debug_pool(gw: Gateway) -> dict[str, dict[str, Any]]:
    """The EPP's ``/debug/pool``, keyed by endpoint address."""
    body = json.loads(gw.epp_get("/debug/pool"))
    return {ep["address"]: ep for ep in body["endpoints"]}


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


@dataclass
class RealPool:
    """What the checks get: the servers, the gateway in front, and how they were made."""

    servers: list[VllmServer]
    gateway: Gateway
    local: bool
    model: str
    #: adapter → the servers that list it in /v1/models
    adapters: dict[str, list[VllmServer]]
    workdir: Path
    venv: Path | None

    def server(self, feature: str) -> VllmServer:
        """The local server started with ``feature`` (``lora``, ``small-kv``, ...)."""
        return next(s for s in self.servers if feature in s.features)


@dataclass
class PDPool:
    """Prefill/decode on real vLLM: the :func:`pd_servers` pair, a ``pd-sidecar``
    (``--kv-connector shared-storage``) in front of the decoder on the pool's port, and a
    gateway whose EPP runs llm-d's P/D profile over two pods, ``pd-prefill`` (role
    ``prefill``) and ``pd-decode`` (role ``decode``, its target port the sidecar's)."""

    workdir: Path
    model: str
    prefiller: VllmServer
    decoder: VllmServer
    #: The decode pod as the pool sees it: the sidecar's address.
    decode_pod: VllmServer
    shared_dir: Path
    gateway: Gateway | None = None
    sidecar: subprocess.Popen[bytes] | None = None
    sidecar_metrics_port: int = 0

    @classmethod
    def local(cls, workdir: Path, model: str) -> PDPool:
        shared = workdir / "kv-shared"
        shared.mkdir(parents=True, exist_ok=True)
        prefiller, decoder = pd_servers(e.free_port(), shared)
        pod = VllmServer("pd-decode", decoder.host, prefiller.port)
        return cls(workdir, model, prefiller, decoder, pod, shared)

    def start(self, venv: Path, model_dir: Path) -> PDPool:
        """Start both vLLM servers, then :meth:`start_gateway`."""
        start_vllm(venv, model_dir, [self.prefiller, self.decoder], self.workdir)
        return self.start_gateway()

    def start_gateway(self) -> PDPool:
        """The P/D gateway and the decoder's sidecar, in front of servers already running."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.gateway = Gateway(self.workdir / "gateway", [self.prefiller, self.decode_pod],
                               self.model, [], epp_config=PD_EPP_CONFIG.read_text(),
                               roles={self.prefiller.name: "prefill",
                                      self.decode_pod.name: "decode"})
        self.gateway.start()
        self.sidecar_metrics_port = e.free_port()
        log = self.workdir / "sidecar.log"
        with log.open("wb") as out:
            self.sidecar = subprocess.Popen(
                [sys.executable, "-m", "sidecar.main", "--host", self.decode_pod.host,
                 "--port", str(self.decode_pod.port), "--vllm-host", self.decoder.host,
                 "--vllm-port", str(self.decoder.port), "--kv-connector", "shared-storage",
                 "--manifests", str(self.gateway.manifests), "--inference-pool", POOL,
                 "--metrics-port", str(self.sidecar_metrics_port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 60
        while True:
            if self.sidecar.poll() is not None:
                raise RuntimeError(f"pd-sidecar exited {self.sidecar.returncode}:\n"
                                   + log.read_text(errors="replace"))
            try:
                self.decode_pod.get("/health", timeout=2)
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("pd-sidecar not answering /health after 60s") from None
                time.sleep(0.2)

    def sidecar_metrics(self) -> str:
        url = f"http://{self.decode_pod.host}:{self.sidecar_metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            return str(r.read().decode())

    def stop(self) -> None:
        """Stop the gateway, the sidecar and both vLLM servers."""
        self.stop_gateway()
        stop_vllm([self.prefiller, self.decoder])

    def stop_gateway(self) -> None:
        """Stop the sidecar and the gateway (the servers keep running)."""
        if self.sidecar is not None and self.sidecar.poll() is None:
            self.sidecar.terminate()
            try:
                self.sidecar.wait(10)
            except subprocess.TimeoutExpired:
                self.sidecar.kill()
                self.sidecar.wait()
        if self.gateway is not None:
            self.gateway.stop()
