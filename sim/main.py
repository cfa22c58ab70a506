"""``vllm-sim``: serve one or many simulated vLLM-compatible model servers from one process."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from sim.config import (
    DEFAULT_MODEL,
    ENGINES,
    Faults,
    ServerConfig,
    load_config_file,
    parse_lora_modules,
)
from sim.encoder import parse_ec_transfer_config
from sim.fleet import Fleet
from sim.kvevents import HASH_ALGOS, KVEventsConfig
from sim.pd import parse_kv_transfer_config
from sim.profiles import PROFILES, get_profile

log = logging.getLogger("sim")
T = TypeVar("T")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _port_range(text: str) -> list[int]:
    lo, sep, hi = text.partition("-")
    try:
        first = int(lo)
        last = int(hi) if sep else first
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad port range {text!r} (expected A-B)") from None
    if not 0 < first <= last <= 65535:
        raise argparse.ArgumentTypeError(f"bad port range {text!r}")
    return list(range(first, last + 1))


def _nonneg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return v


def _positive(text: str) -> float:
    v = _nonneg(text)
    if v == 0:
        raise argparse.ArgumentTypeError("must be positive")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = _Parser(prog="vllm-sim", description=__doc__,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("listeners")
    g.add_argument("--host", default="127.0.0.1", help="address to bind")
    g.add_argument("--port", type=int, action="append", default=[],
                   help="port to serve (repeatable); 0 picks a free port")
    g.add_argument("--ports", type=_port_range, action="append", default=[],
                   help="range of ports A-B, one simulated server each (repeatable)")
    g.add_argument("--name", default="sim-{port}",
                   help="x-inference-pod value; {port} is replaced by the port")
    g.add_argument("--config", help="YAML file of servers (port, name, profile, overrides, "
                   "faults, ...); flags give the defaults")
    m = p.add_argument_group("model")
    m.add_argument("--model", default=DEFAULT_MODEL, help="base model name")
    m.add_argument("--served-model-name", nargs="+", default=[],
                   help="names the base model answers to (first one labels metrics)")
    m.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME[=PATH]",
                   help="LoRA adapters known at start")
    m.add_argument("--kv-events-config", metavar="JSON",
                   help="vLLM's KV events config, e.g. '{\"enable_kv_cache_events\": true, "
                   "\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\"}'; with several "
                   "servers a fixed endpoint port is offset by the server's index")
    m.add_argument("--prefix-caching-hash-algo", choices=HASH_ALGOS, default="sha256",
                   help="block hash algorithm (vLLM's flag); used when KV events are on")
    m.add_argument("--engine", choices=ENGINES, default="vllm", help="metrics dialect")
    m.add_argument("--gpu-cache-usage-metric", action="store_true",
                   help="also export vllm:gpu_cache_usage_perc (older vLLM name)")
    t = p.add_argument_group("timing and capacity (override the profile)")
    t.add_argument("--profile", choices=sorted(PROFILES), default="8b-h100",
                   help="timing/capacity profile")
    t.add_argument("--time-scale", type=_positive, default=1.0,
                   help="multiply every simulated duration (0.1 = 10x faster than real)")
    t.add_argument("--seed", type=int, default=0, help="random seed (output lengths, faults)")
    t.add_argument("--inter-token-latency", type=_nonneg, metavar="MS",
                   help="decode time per token at an empty batch")
    t.add_argument("--prefill-overhead", type=_nonneg, metavar="MS",
                   help="fixed cost of a step that prefills")
    t.add_argument("--prefill-time-per-token", type=_nonneg, metavar="MS",
                   help="prefill cost per uncached prompt token")
    t.add_argument("--load-factor", type=_positive,
                   help="slowdown when the batch is full (1 = none)")
    t.add_argument("--speed", type=_positive,
                   help="relative speed of the server: every step takes 1/SPEED of the "
                        "profile's time (0.5 = half as fast)")
    t.add_argument("--max-num-seqs", type=int, help="running batch size")
    t.add_argument("--max-waiting", type=int, help="waiting queue cap (429 beyond)")
    t.add_argument("--max-num-batched-tokens", type=int,
                   help="token budget of one engine step (vLLM V1; decodes + prefill chunks)")
    t.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=None, help="split prompts over steps to fit the token budget "
                   "(vLLM V1's default: on)")
    t.add_argument("--block-size", type=int, help="tokens per KV block")
    t.add_argument("--num-gpu-blocks", type=int, help="KV cache size in blocks")
    t.add_argument("--max-model-len", type=int, help="prompt + output token limit")
    t.add_argument("--max-loras", type=int, help="LoRA slots")
    t.add_argument("--lora-load-time", type=_nonneg, metavar="MS", help="cost of loading a LoRA")
    t.add_argument("--default-max-tokens", type=int,
                   help="output length when a request has no max_tokens")
    t.add_argument("--random-output-length", action="store_true",
                   help="output length uniform in [1, max_tokens] (seeded) instead of exact")
    k = p.add_argument_group("prefill/decode disaggregation (docs/pd.md)")
    k.add_argument("--kv-transfer-config", metavar="JSON",
                   help="vLLM's P/D connector config, e.g. "
                   "'{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'; "
                   "simulator keys: link (rdma|tcp), bandwidth (GB/s), latency (ms), "
                   "kv_bytes_per_token, abort_timeout (s)")
    k.add_argument("--ec-transfer-config", metavar="JSON",
                   help="vLLM's encoder-cache connector config (E/PD, E/P/D; sim/encoder.py), "
                   "e.g. '{\"ec_connector\":\"ECSharedStorageConnector\",\"ec_role\":"
                   "\"ec_producer\",\"ec_connector_extra_config\":{\"shared_storage_path\":"
                   "\"/tmp/ec\"}}'")
    f = p.add_argument_group("fault injection (also live: POST /sim/faults)")
    f.add_argument("--error-rate", type=_nonneg, default=0.0,
                   help="fraction of inference requests failed")
    f.add_argument("--error-status", type=int, default=500, help="status of injected errors")
    f.add_argument("--added-latency", type=_nonneg, default=0.0, metavar="MS",
                   help="delay before a request is queued")
    f.add_argument("--hang", action="store_true", help="never answer inference requests")
    f.add_argument("--metrics-hang", action="store_true", help="never answer /metrics")
    f.add_argument("--metrics-delay", type=_nonneg, default=0.0, metavar="MS",
                   help="delay before /metrics answers")
    f.add_argument("--kill-after", type=_nonneg, metavar="SECONDS",
                   help="stop listening after this long")
    f.add_argument("--revive-after", type=_nonneg, metavar="SECONDS",
                   help="come back this long after being killed")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"], help="log level")
    return p


_MS_FIELDS = {"inter_token_latency", "prefill_overhead", "prefill_time_per_token",
              "lora_load_time"}
_INT_FIELDS = {"max_num_seqs", "max_waiting", "block_size", "num_gpu_blocks", "max_model_len",
               "max_loras", "default_max_tokens", "max_num_batched_tokens"}


def _json_flag(flag: str, text: str | None, parse: Callable[[Any], T]) -> T | None:
    """A flag whose value is a JSON document read by ``parse`` (None when not given)."""
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: not valid JSON: {exc}") from None
    return parse(doc)


def configs_from_args(args: argparse.Namespace) -> list[ServerConfig]:
    """Server configs for the parsed command line (raises ``ValueError`` on bad input)."""
    overrides: dict[str, Any] = {}
    for name in _MS_FIELDS | _INT_FIELDS | {"load_factor", "enable_chunked_prefill", "speed"}:
        value = getattr(args, name)
        if value is None:
            continue
        if name in _INT_FIELDS and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
        overrides[name] = value / 1000.0 if name in _MS_FIELDS else value
    if args.error_rate > 1:
        raise ValueError("--error-rate must be between 0 and 1")
    faults = Faults(error_rate=args.error_rate, error_status=args.error_status,
                    added_latency=args.added_latency / 1000.0, hang=args.hang,
                    metrics_hang=args.metrics_hang, metrics_delay=args.metrics_delay / 1000.0,
                    kill_after=args.kill_after, revive_after=args.revive_after)
    kv_transfer = _json_flag("--kv-transfer-config", args.kv_transfer_config,
                             parse_kv_transfer_config)
    ec_transfer = _json_flag("--ec-transfer-config", args.ec_transfer_config,
                             parse_ec_transfer_config)
    base = ServerConfig(host=args.host, name=args.name, model=args.model,
                        served_model_names=list(args.served_model_name), engine=args.engine,
                        profile=get_profile(args.profile).with_overrides(overrides),
                        time_scale=args.time_scale, seed=args.seed,
                        lora_modules=parse_lora_modules(args.lora_modules),
                        random_output_length=args.random_output_length,
                        gpu_cache_usage_metric=args.gpu_cache_usage_metric, faults=faults,
                        kv_transfer=kv_transfer, ec_transfer=ec_transfer,
                        kv_events=(KVEventsConfig.from_json(args.kv_events_config)
                                   if args.kv_events_config else None),
                        prefix_caching_hash_algo=args.prefix_caching_hash_algo)
    ports = list(args.port) + [p for r in args.ports for p in r]
    configs: list[ServerConfig] = []
    if args.config:
        configs = load_config_file(args.config, base)
    for i, port in enumerate(ports):
        configs.append(dataclasses.replace(base, port=port, seed=base.seed + i,
                                           faults=dataclasses.replace(faults)))
    if not configs:
        configs = [dataclasses.replace(base, port=8000)]
    for i, c in enumerate(configs):
        if c.kv_events is not None:
            c.kv_events = c.kv_events.for_server(i)
    # Servers on different loopback addresses may share a port (one IP per simulated pod).
    seen: set[tuple[str, int]] = set()
    for c in configs:
        if c.port and (c.host, c.port) in seen:
            raise ValueError(f"port {c.port} given twice on {c.host}")
        seen.add((c.host, c.port))
    return configs


async def serve(configs: list[ServerConfig]) -> None:
    """Run a fleet until SIGINT/SIGTERM."""
    fleet = Fleet(configs)
    await fleet.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    for s in fleet.servers:
        log.info("serving %s on %s (profile %s, engine %s, time scale %g)", s.name, s.url,
                 s.cfg.profile.name, s.cfg.engine, s.cfg.time_scale)
    print("vllm-sim ready: " + " ".join(fleet.urls), flush=True)
    try:
        await stop.wait()
    finally:
        log.info("stopping %d server(s)", len(fleet.servers))
        await fleet.stop()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        configs = configs_from_args(args)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    try:
        import uvloop  # measured faster here; optional
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(configs))
    except OSError as exc:  # e.g. port already in use
        print(f"vllm-sim: error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
