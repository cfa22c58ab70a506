"""Configuration of simulated servers: one :class:`ServerConfig` per port, plus YAML loading."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sim.encoder import ECTransferConfig, parse_ec_transfer_config
from sim.kvevents import HASH_ALGOS, KVEventsConfig
from sim.pd import KVTransferConfig, parse_kv_transfer_config
from sim.profiles import H100_8B, Profile, get_profile

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ENGINES = ("vllm", "sglang", "trtllm-serve")


@dataclass(slots=True)
class Faults:
    """Injected misbehaviour; every field can be changed live through ``POST /sim/faults``."""

    #: Fraction of inference requests answered with ``error_status`` (0..1).
    error_rate: float = 0.0
    #: Status code of injected errors.
    error_status: int = 500
    #: Seconds added before an inference request is queued (model time is not involved).
    added_latency: float = 0.0
    #: Accept inference requests and never answer them.
    hang: bool = False
    #: ``/metrics`` never answers.
    metrics_hang: bool = False
    #: Seconds before ``/metrics`` answers.
    metrics_delay: float = 0.0
    #: Stop the listener this many seconds after start (``None``: never).
    kill_after: float | None = None
    #: Bring a killed server back after this many seconds (``None``: stay down).
    revive_after: float | None = None
    #: Pin the GPU utilization ``/dcgm/metrics`` reports, in percent (``None``: from load).
    gpu_util_percent: float | None = None

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a JSON object of changes; raises ``ValueError`` on unknown fields or types."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        for key, value in changes.items():
            if key not in fields:
                raise ValueError(f"unknown fault {key!r} (known: {', '.join(sorted(fields))})")
            if key in ("hang", "metrics_hang"):
                if not isinstance(value, bool):
                    raise ValueError(f"fault {key!r} must be a boolean")
            elif key == "error_status":
                if not isinstance(value, int) or not 400 <= value <= 599:
                    raise ValueError("fault 'error_status' must be an HTTP error status")
            elif value is None and key in ("kill_after", "revive_after", "gpu_util_percent"):
                pass
            elif not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"fault {key!r} must be a non-negative number")
            elif key == "error_rate" and value > 1:
                raise ValueError("fault 'error_rate' must be between 0 and 1")
            elif key == "gpu_util_percent" and value > 100:
                raise ValueError("fault 'gpu_util_percent' must be between 0 and 100")
            setattr(self, key, value)

    def to_json(self) -> dict[str, Any]:
        """The faults as a JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclass(slots=True)
class ServerConfig:
    """Everything that defines one simulated server."""

    port: int = 0
    host: str = "127.0.0.1"
    #: Value of the ``x-inference-pod`` header; ``{port}`` is replaced by the bound port.
    name: str = "sim-{port}"
    model: str = DEFAULT_MODEL
    served_model_names: list[str] = field(default_factory=list)
    engine: str = "vllm"
    profile: Profile = H100_8B
    time_scale: float = 1.0
    seed: int = 0
    #: Known LoRA adapters: name -> path.
    lora_modules: dict[str, str] = field(default_factory=dict)
    #: Output length is uniform in [1, max_tokens] (seeded) instead of exactly max_tokens.
    random_output_length: bool = False
    #: Export ``vllm:gpu_cache_usage_perc`` as well as ``vllm:kv_cache_usage_perc``.
    gpu_cache_usage_metric: bool = False
    faults: Faults = field(default_factory=Faults)
    #: P/D connector and role (``--kv-transfer-config``); ``None``: no connector.
    kv_transfer: KVTransferConfig | None = None
    #: Encode disaggregation (``--ec-transfer-config``, :mod:`sim.encoder`); ``None``: none.
    ec_transfer: ECTransferConfig | None = None
    #: vLLM's ``--kv-events-config`` (``None``: no KV events).
    kv_events: KVEventsConfig | None = None
    #: vLLM's ``--prefix-caching-hash-algo``; block hashes follow it when events are on.
    prefix_caching_hash_algo: str = "sha256"

    def __post_init__(self) -> None:
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise ValueError(f"unknown prefix_caching_hash_algo {self.prefix_caching_hash_algo!r}"
                             f" (known: {', '.join(HASH_ALGOS)})")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r} (known: {', '.join(ENGINES)})")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be positive")

    @property
    def model_names(self) -> list[str]:
        """Names the base model answers to; the first one labels metrics."""
        return self.served_model_names or [self.model]

    def pod_name(self, port: int) -> str:
        """The ``x-inference-pod`` value once the port is known."""
        return self.name.replace("{port}", str(port))


def parse_lora_modules(items: list[str]) -> dict[str, str]:
    """``name`` or ``name=path`` items (vLLM's ``--lora-modules`` form) -> name -> path."""
    out: dict[str, str] = {}
    for item in items:
        name, _, path = item.partition("=")
        if not name:
            raise ValueError(f"bad LoRA module {item!r}: expected name or name=path")
        out[name] = path or f"/adapters/{name}"
    return out


_SERVER_KEYS = {
    "port", "host", "name", "model", "served_model_names", "engine", "profile", "overrides",
    "time_scale", "seed", "lora_modules", "random_output_length", "gpu_cache_usage_metric",
    "faults", "kv_transfer_config", "kv_events_config", "prefix_caching_hash_algo",
    "ec_transfer_config",
}


def server_from_dict(data: dict[str, Any], base: ServerConfig) -> ServerConfig:
    """A server config from one YAML entry, starting from ``base`` (the command-line defaults)."""
    unknown = sorted(set(data) - _SERVER_KEYS)
    if unknown:
        raise ValueError(f"unknown server key(s): {', '.join(unknown)}")
    cfg = dataclasses.replace(base, faults=dataclasses.replace(base.faults),
                              lora_modules=dict(base.lora_modules))
    if "kv_events_config" in data:
        cfg.kv_events = KVEventsConfig.from_json(data["kv_events_config"])
    for key in ("port", "host", "name", "model", "engine", "time_scale", "seed",
                "random_output_length", "gpu_cache_usage_metric", "prefix_caching_hash_algo"):
        if key in data:
            setattr(cfg, key, data[key])
    if "served_model_names" in data:
        names = data["served_model_names"]
        cfg.served_model_names = [names] if isinstance(names, str) else list(names)
    if "profile" in data:
        cfg.profile = get_profile(data["profile"])
    if "overrides" in data:
        cfg.profile = cfg.profile.with_overrides(dict(data["overrides"]))
    if "lora_modules" in data:
        mods = data["lora_modules"]
        cfg.lora_modules = (
            {str(k): str(v) for k, v in mods.items()}
            if isinstance(mods, dict)
            else parse_lora_modules([str(m) for m in mods])
        )
    if "faults" in data:
        cfg.faults.update(dict(data["faults"]))
    if "kv_transfer_config" in data:
        kv = data["kv_transfer_config"]
        cfg.kv_transfer = None if kv is None else parse_kv_transfer_config(
            kv, where="kv_transfer_config")
    if "ec_transfer_config" in data:
        ec = data["ec_transfer_config"]
        cfg.ec_transfer = None if ec is None else parse_ec_transfer_config(
            ec, where="ec_transfer_config")
    cfg.__post_init__()
    return cfg


def load_config_file(path: str | Path, base: ServerConfig) -> list[ServerConfig]:
    """Servers from a YAML file: a list of servers, or ``{defaults: {...}, servers: [...]}``."""
    data = yaml.safe_load(Path(path).read_text())
    if isinstance(data, dict):
        if "defaults" in data:
            base = server_from_dict(dict(data["defaults"]), base)
        entries = data.get("servers", [])
    else:
        entries = data
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{path}: expected a list of servers (or a 'servers:' list)")
    return [server_from_dict(e, base) for e in entries]
