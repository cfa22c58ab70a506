"""``epp``: the endpoint picker's command line (upstream flag names and defaults)."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import Awaitable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import structlog
from aiohttp import web

from epp import telemetry as m
from epp.config import ConfigError, EndpointPickerConfig, Runtime, build, load_config_file
from epp.config import parse_config as parse_config_text
from epp.datastore import Datastore
from epp.handle import Settings
from epp.handlers.exchange import PickerExchange
from epp.leader import LeaderElector, report_readiness
from epp.metrics import ScraperConfig
from epp.requestcontrol import Director
from epp.scheduling import SchedulerHooks
from epp.sources import ManifestError, ManifestSource, Source
from epp.sources.standalone import standalone_pool
from shared import logs
from shared.extproc import DEFAULT_MAX_BODY, BodyMode, ExtProcServicer
from shared.flags import Parser, die, duration
from shared.metrics_server import read_token, run_metrics_server
from shared.server import Health, ServeOptions, install_uvloop, serve

log = structlog.get_logger("epp")


def parser() -> Parser:
    p = Parser(prog="epp", description="Endpoint picker: an Envoy ext_proc service that picks "
               "the model-server endpoint for each inference request of one InferencePool.")
    p.add_argument("--grpc-port", type=int, default=9002, help="ext_proc gRPC port")
    p.add_argument("--grpc-health-port", type=int, default=9003, help="gRPC health port")
    p.add_argument("--metrics-port", type=int, default=9090,
                   help="Prometheus metrics (and /debug/pool) port")
    p.add_argument("--pool-name", default=None, help="the InferencePool this EPP serves")
    p.add_argument("--pool-namespace", default=os.environ.get("NAMESPACE") or "default",
                   help="its namespace (default: $NAMESPACE, else default)")
    p.add_argument("--pool-group", default="inference.networking.k8s.io",
                   help="API group of the InferencePool")
    cfg = p.add_mutually_exclusive_group()
    cfg.add_argument("--config-file", default=None, help="EndpointPickerConfig YAML file")
    cfg.add_argument("--config-text", default=None, help="EndpointPickerConfig YAML text")
    p.add_argument("--check-config", nargs="?", const="", default=None, metavar="FILE",
                   help="validate the EndpointPickerConfig (FILE, or --config-file / "
                        "--config-text) and exit: 0 when usable, 1 with the reason")
    p.add_bool("--secure-serving", default=True, help="serve ext_proc over TLS")
    p.add_argument("--cert-path", default=None,
                   help="directory with tls.crt and tls.key (reloaded on change); "
                        "default: a self-signed certificate")
    p.add_argument("--refresh-metrics-interval", type=duration, default=0.05,
                   help="how often each endpoint's metrics are scraped (default 50ms)")
    p.add_argument("--metrics-staleness-threshold", type=duration, default=2.0,
                   help="metrics older than this don't count in pool gauges (default 2s)")
    p.add_argument("--model-server-metrics-path", default="/metrics",
                   help="path of the model servers' Prometheus metrics")
    p.add_argument("--model-server-metrics-port", type=int, default=None,
                   help="scrape this port instead of each endpoint's target port")
    p.add_bool("--disable-endpoint-subset-filter", default=False,
               help="ignore the proxy's envoy.lb.subset_hint")
    p.add_bool("--ha-enable-leader-election", default=False,
               help="active-passive replicas: only the Lease holder reports ready")
    p.add_argument("--endpoint-selector", default=None,
                   help="pods by label (k=v,...) instead of an InferencePool")
    p.add_argument("--endpoint-target-ports", default=None,
                   help="target ports for --endpoint-selector (comma-separated)")
    p.add_argument("--manifests", default=None, metavar="PATH",
                   help="YAML file or directory of InferencePool/Objective/Rewrite/Pod objects, "
                        "used instead of the Kubernetes API and re-read when it changes")
    p.add_bool("--reject-unknown-models", default=False,
               help="404 for models no rewrite, legacy model or server names")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY,
                   help="largest request body accepted; bigger gets 413")
    p.add_argument("--grace-period", type=float, default=30.0,
                   help="seconds in-flight streams get to finish on SIGTERM")
    p.add_argument("--metrics-bearer-token-file", default=None,
                   help="require 'Authorization: Bearer <token>' on the metrics port")
    p.add_argument("-v", "--v", dest="verbosity", type=int, nargs="?", const=4, default=0,
                   help="log verbosity (4 and above: debug)")
    return p


def debug_pool_route(datastore: Datastore) -> Any:
    """``/debug/pool``: every endpoint, its latest metrics and age, and in-flight counts."""

    async def handler(_: web.Request) -> web.Response:
        now = time.monotonic()
        snap = datastore.snapshot
        body = {
            "pool": snap.pool.name if snap.pool else None,
            "synced": datastore.is_synced,
            "endpoints": [
                {
                    "name": v.endpoint.name, "address": v.key, "healthy": v.healthy,
                    "age_seconds": None if v.age(now) == float("inf") else round(v.age(now), 3),
                    "waiting": v.metrics.waiting, "running": v.metrics.running,
                    "kv_usage": v.metrics.kv_usage, "queue": v.queue,
                    "inflight_requests": v.inflight_requests,
                    "inflight_tokens": v.inflight_tokens,
                    "lora_running": sorted(v.metrics.lora.running) if v.metrics.lora else [],
                    "lora_waiting": sorted(v.metrics.lora.waiting) if v.metrics.lora else [],
                    "max_lora": v.metrics.lora.max_lora if v.metrics.lora else None,
                    "block_size": v.metrics.block_size,
                    "num_gpu_blocks": v.metrics.num_gpu_blocks,
                }
                for v in datastore.views()
            ],
        }
        return web.json_response(body)

    return handler


def settings(args: Any) -> Settings:
    """The flag-given settings plugins see through the handle."""
    return Settings(
        reject_unknown_models=args.reject_unknown_models,
        subset_filter=not args.disable_endpoint_subset_filter,
        staleness=args.metrics_staleness_threshold,
        scraper=ScraperConfig(interval=args.refresh_metrics_interval,
                              path=args.model_server_metrics_path,
                              port=args.model_server_metrics_port),
    )


def load_config(args: Any, path: str | None = None) -> EndpointPickerConfig:
    """The EndpointPickerConfig the flags name (``path`` first); ConfigError if unusable."""
    path = path or args.config_file
    if path:
        return load_config_file(path)
    return parse_config_text(args.config_text, source="--config-text")


def check_config(args: Any) -> None:
    """``--check-config``: build everything a config names (no serving) and exit 0 or 1."""
    try:
        build(load_config(args, args.check_config), settings=settings(args))
    except ConfigError as e:
        die("epp", f"bad EndpointPickerConfig: {e}")
    print("epp: EndpointPickerConfig is valid")
    sys.exit(0)


def metrics_hooks(hit_ratio: m.HitRatio) -> SchedulerHooks:
    """The scheduler's timings and prefix hits, into the exported metrics."""
    return SchedulerHooks(
        e2e_duration=m.SCHEDULER_E2E.observe,
        prefix_hit_ratio=hit_ratio.observe,
        plugin_duration=lambda point, kind, name, s: m.PLUGIN_DURATION.labels(
            point, kind, name).observe(s),
    )


async def run(args: Any) -> None:
    """Build everything, serve until SIGTERM."""
    datastore = Datastore()
    hit_ratio = m.HitRatio()
    try:
        runtime = build(load_config(args), datastore, settings(args),
                        rng=random.Random(), hooks=metrics_hooks(hit_ratio))
    except ConfigError as e:
        die("epp", f"bad EndpointPickerConfig: {e}")
    stop = asyncio.Event()
    source, elector = start_source(args, datastore)
    datastore.subscribe(lambda s: runtime.retain_endpoints(frozenset(e.key for e in s.endpoints)))
    director = Director.of(runtime)
    register_pool_metrics(args, runtime, hit_ratio)
    try:
        token = read_token(args.metrics_bearer_token_file)
    except OSError as e:
        die("epp", f"cannot read --metrics-bearer-token-file: {e.strerror or e}")

    servicer = ExtProcServicer(lambda: PickerExchange(director),
                               request_mode=BodyMode.FULL_DUPLEX_STREAMED,
                               response_mode=BodyMode.FULL_DUPLEX_STREAMED,
                               max_body=args.max_body_bytes)
    opts = ServeOptions(grpc_port=args.grpc_port, health_port=args.grpc_health_port,
                        secure=args.secure_serving, cert_path=args.cert_path,
                        grace=args.grace_period,
                        max_message_bytes=args.max_body_bytes + 1024 * 1024)

    async def ready(health: Health) -> None:
        await report_readiness(health.set_serving, datastore.synced, elector)

    background: list[Awaitable[None]] = [
        *(s.run(datastore) for s in runtime.data_sources),
        source.run(),
        run_metrics_server(args.metrics_port, token=token,
                           routes={"/debug/pool": debug_pool_route(datastore)}),
    ]
    if elector is not None:
        # Sharing ``stop``: a draining leader hands the Lease back at once.
        background.append(elector.run(stop))
    await serve(servicer, opts, ready=ready, background=background, stop=stop)


def register_pool_metrics(args: Any, runtime: Runtime, hit_ratio: m.HitRatio) -> None:
    """The pool gauges, computed from the datastore when Prometheus scrapes."""
    # In Kubernetes mode the pool arrives after start; the flag names it either way.
    pool = runtime.datastore.snapshot.pool
    pool_name = args.pool_name or (pool.name if pool else "unknown")
    scheduler = runtime.scheduler
    m.register_pool(m.PoolCollector(
        pool_name, runtime.datastore, staleness=args.metrics_staleness_threshold,
        prefix_stats=lambda: (scheduler.prefix_indexer_size, hit_ratio.value)))


def start_source(args: Any, datastore: Datastore) -> tuple[Source, LeaderElector | None]:
    """The manifests file, or the Kubernetes API (plus a leader elector with HA); exits with
    one line when either can't be set up."""
    if args.manifests is not None:
        if args.ha_enable_leader_election:
            die("epp", "--ha-enable-leader-election needs the Kubernetes API, not --manifests")
        try:
            standalone = None
            if args.endpoint_selector:
                standalone = standalone_pool(args.endpoint_selector, args.endpoint_target_ports,
                                             pool_name=args.pool_name,
                                             namespace=args.pool_namespace)
            manifests = ManifestSource(args.manifests, datastore, pool_name=args.pool_name,
                                       pool_namespace=args.pool_namespace,
                                       standalone=standalone)
            manifests.load()
        except (ManifestError, ValueError) as e:
            die("epp", str(e))
        return manifests, None
    # Imported here so --manifests never loads the Kubernetes client.
    from epp.leader import lease_name_for
    from epp.sources.kubernetes import KubernetesSource
    from shared.reflector import KubernetesConfigError, load_api_client

    if not args.pool_name and not args.endpoint_selector:
        die("epp", "give --pool-name (or --endpoint-selector), or --manifests PATH")
    try:
        api = load_api_client()
        source = KubernetesSource(
            datastore, args.pool_name or "", args.pool_namespace, args.pool_group,
            api_client=api, endpoint_selector=args.endpoint_selector,
            target_ports=args.endpoint_target_ports)
    except (KubernetesConfigError, ValueError) as e:
        die("epp", str(e))
    elector = None
    if args.ha_enable_leader_election:
        name = lease_name_for(args.pool_namespace, args.pool_name or "endpoints")
        elector = LeaderElector(name, args.pool_namespace, api_client=api)
    return source, elector


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.check_config is not None:
        check_config(args)
    if args.endpoint_selector and not args.endpoint_target_ports:
        die("epp", "--endpoint-selector needs --endpoint-target-ports")
    logs.configure(args.verbosity)
    try:
        m.INFO.labels(commit=version("inference-gateway-py"), build_ref="").set(1)
    except PackageNotFoundError:
        m.INFO.labels(commit="dev", build_ref="").set(1)
    install_uvloop()
    try:
        asyncio.run(run(args))
    except OSError as e:
        die("epp", f"cannot serve: {e}")
    sys.exit(0)


if __name__ == "__main__":
    main()
