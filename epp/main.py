"""``epp``: the endpoint picker's command line (upstream flag names and defaults)."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from epp import telemetry as m
from epp.config import ConfigError, EndpointPickerConfig, Runtime, build, load_config_file
from epp.config import parse_config as parse_config_text
from epp.config.stability import ExperimentalPluginError, check_stability
from epp.datastore import Datastore, FailureMode
from epp.flowcontrol import FlowController
from epp.handle import Settings
from epp.handlers.exchange import PickerExchange
from epp.kvcache.metrics import cached_blocks
from epp.leader import LeaderElector, report_readiness
from epp.metrics import ScraperConfig
from epp.requestcontrol import Director
from epp.scheduling import SchedulerHooks
from epp.sources import ManifestError, ManifestSource, Source
from epp.sources.standalone import standalone_pool
from epp.statestore import StoreURL, StoreURLError, open_store, parse_store_url
from modelserver.pd import ROLE_LABEL
from shared import buildinfo, logs, tracing
from shared.extproc import DEFAULT_MAX_BODY, DEFAULT_MAX_BUFFERED, BodyMode, ExtProcServicer
from shared.flags import Parser, byte_size, die, duration
from shared.metrics_server import read_token, run_metrics_server
from shared.server import Health, ServeOptions, install_uvloop, message_limit, serve
from shared.upstream_flags import (
    IGNORED,
    add_diagnostics_flags,
    add_logging_flags,
    log_settings,
    report,
    start_tracing,
)

log = structlog.get_logger("epp")


def parser() -> Parser:
    p = Parser(prog="epp", description="Endpoint picker: an Envoy ext_proc service that picks "
               "the model-server endpoint for each inference request of one InferencePool.")
    p.add_argument("--grpc-port", type=int, default=9002, help="ext_proc gRPC port")
    p.add_argument("--grpc-health-port", type=int, default=9003, help="gRPC health port")
    p.add_argument("--metrics-port", type=int, default=9090,
                   help="Prometheus metrics (and /debug) port")
    p.add_argument("--bind-address", default="0.0.0.0", metavar="HOST",
                   help="address the ext_proc, health and metrics ports listen on (ours; "
                        "default every interface, as in a pod; gateway-stack: 127.0.0.1)")
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
    p.add_argument("--client-ca-file", default=None, metavar="FILE",
                   help="PEM CA bundle: the ext_proc port then requires a client certificate "
                        "it signed (mTLS; the gateway's Envoy presents one)")
    p.add_argument("--refresh-metrics-interval", type=duration, default=0.05,
                   help="how often each endpoint's metrics are scraped (default 50ms)")
    p.add_argument("--metrics-staleness-threshold", type=duration, default=2.0,
                   help="metrics older than this don't count in pool gauges (default 2s)")
    p.add_argument("--model-server-metrics-path", default="/metrics",
                   help="path of the model servers' Prometheus metrics (deprecated upstream: "
                        "metrics-data-source's path parameter)")
    p.add_argument("--model-server-metrics-port", type=int, default=None,
                   help="scrape this port instead of each endpoint's target port "
                        "(deprecated upstream)")
    p.add_argument("--model-server-metrics-scheme", choices=("http", "https"), default="http",
                   help="scrape over http or https (deprecated upstream: metrics-data-source's "
                        "scheme parameter)")
    p.add_bool("--model-server-metrics-https-insecure-skip-verify", default=True,
               help="with https, accept any model-server certificate (deprecated upstream: "
                    "metrics-data-source's insecureSkipVerify parameter)")
    for flag, what in METRIC_FLAGS.items():
        p.add_argument(f"--{flag}", type=metric_spec, default=None, metavar="SPEC",
                       help=f"metric {what} of pods without an engine-type label, e.g. "
                            f"name{{label=value}} (deprecated upstream: core-metrics-"
                            f"extractor's engineConfigs)")
    p.add_argument("--refresh-prometheus-metrics-interval", type=duration, default=5.0,
                   help="accepted for upstream compatibility; pool gauges are computed when "
                        "Prometheus scrapes")
    p.add_bool("--health-checking", default=False,
               help="also serve the gRPC health service on the ext_proc port")
    p.add_bool("--enable-cert-reload", default=False,
               help="accepted for upstream compatibility; --cert-path files are always "
                    "re-read when they change")
    add_diagnostics_flags(p)
    add_logging_flags(p)
    p.add_bool("--disable-endpoint-subset-filter", default=False,
               help="ignore the proxy's envoy.lb.subset_hint")
    p.add_bool("--ha-enable-leader-election", default=False,
               help="active-passive replicas: only the Lease holder reports ready")
    p.add_argument("--ha-mode", choices=HA_MODES, default=None,
                   help="active-passive: same as --ha-enable-leader-election; active-active: "
                        "every replica serves and they share routing state through "
                        "--state-store (docs/active-active.md)")
    p.add_argument("--state-store", default="memory://", metavar="URL",
                   help="where replicas share the prefix index and in-flight counts: "
                        "memory:// (default, nothing shared), valkey://[user:pw@]host:port/db, "
                        "valkeys:// (TLS); redis:// and rediss:// are aliases")
    p.add_argument("--state-store-secret-file", default=None, metavar="FILE",
                   help="shared secret (>= 16 bytes) that signs what replicas write to the "
                        "state store, so a writer without it cannot steer picks (a mounted "
                        f"Secret; env {STORE_SECRET_ENV} also works)")
    p.add_argument("--endpoint-selector", default=None,
                   help="pods by label (k=v,...) instead of an InferencePool")
    p.add_argument("--endpoint-target-ports", default=None,
                   help="target ports for --endpoint-selector (comma-separated)")
    p.add_argument("--manifests", default=None, metavar="PATH",
                   help="YAML file or directory of InferencePool/Objective/Rewrite/Pod objects, "
                        "used instead of the Kubernetes API and re-read when it changes")
    p.add_bool("--reject-unknown-models", default=False,
               help="404 for models no rewrite, legacy model or server names")
    p.add_argument("--max-body-bytes", type=byte_size, default=DEFAULT_MAX_BODY,
                   metavar="SIZE", help="largest request body accepted, e.g. 10485760 or "
                                        "32MiB; bigger gets a JSON 413 (default 10MiB)")
    p.add_argument("--max-buffered-body-bytes", type=byte_size, default=DEFAULT_MAX_BUFFERED,
                   metavar="SIZE",
                   help="request-body bytes all streams may hold at once (bounds memory under "
                        "many concurrent uploads); a chunk over it gets a JSON 503; 0: no bound")
    p.add_argument("--grace-period", type=float, default=30.0,
                   help="seconds in-flight streams get to finish on SIGTERM")
    p.add_argument("--drain-timeout", type=duration, default=0.0,
                   help="after SIGTERM: health NOT_SERVING and the Lease released at once, "
                        "but new ext_proc streams are still served this long (upstream "
                        "default 30s; here 0s, see docs/epp.md); then --grace-period applies")
    p.add_argument("--grpc-max-recv-msg-size", type=byte_size, default=None, metavar="SIZE",
                   help="largest gRPC message received, e.g. 10MiB or 25MB (default: "
                        "max(--max-body-bytes, 64MiB) + 1MiB)")
    p.add_argument("--grpc-max-send-msg-size", type=byte_size, default=None, metavar="SIZE",
                   help="largest gRPC message sent (default: max(--max-body-bytes, 64MiB) "
                        "+ 1MiB)")
    p.add_bool("--emit-endpoint-scores", default=False,
               help="send the primary profile's per-endpoint scores to the proxy in "
                    "envoy.lb metadata x-gateway-destination-endpoint-scores")
    p.add_bool("--allow-experimental-plugins", default=False,
               help="allow plugin types upstream marks Alpha (experimental); without it "
                    "a config naming one is refused")
    p.add_argument("--metrics-bearer-token-file", default=None,
                   help="require 'Authorization: Bearer <token>' on the metrics port")
    p.add_argument("--session-token-key-file", default=None, metavar="FILE",
                   help="HMAC key for session-affinity-scorer tokens (a mounted Secret; "
                        "default: random per process)")
    p.add_argument("-v", "--v", dest="verbosity", type=int, nargs="?", const=4, default=0,
                   help="log verbosity (4 and above: debug)")
    return p


HA_MODES = ("active-passive", "active-active")


def state_store_url(args: Any) -> StoreURL:
    """The parsed ``--state-store``, after checking it fits ``--ha-mode``; one-line exit
    otherwise."""
    if args.ha_mode == "active-passive":
        args.ha_enable_leader_election = True
    elif args.ha_mode == "active-active" and args.ha_enable_leader_election:
        die("epp", "--ha-mode active-active: every replica serves; drop "
                   "--ha-enable-leader-election (that is --ha-mode active-passive)")
    try:
        url = parse_store_url(args.state_store)
    except StoreURLError as e:
        die("epp", f"--state-store: {e}")
    if url.kind != "memory" and args.ha_mode != "active-active":
        die("epp", f"--state-store {url.redacted()} shares state between active-active "
                   "replicas: add --ha-mode active-active")
    return url


#: The deprecated metric-name flags → what they name (keys of ``Settings.metric_overrides``).
METRIC_FLAGS: dict[str, str] = {
    "total-queued-requests-metric": "queued requests",
    "total-running-requests-metric": "running requests",
    "kv-cache-usage-percentage-metric": "KV-cache usage (0 to 1)",
    "lora-info-metric": "LoRA adapters (vLLM label format)",
    "cache-info-metric": "cache configuration (block_size, num_gpu_blocks labels)",
}
_OVERRIDE_KEYS = {"total_queued_requests_metric": "queued",
                  "total_running_requests_metric": "running",
                  "kv_cache_usage_percentage_metric": "kv_usage",
                  "lora_info_metric": "lora", "cache_info_metric": "cache_info"}
_REPLACED_BY = "configure the metrics-data-source plugin's parameters instead"
DEPRECATED: dict[str, str] = {
    "model_server_metrics_scheme": f"--model-server-metrics-scheme: {_REPLACED_BY} (scheme)",
    "model_server_metrics_path": f"--model-server-metrics-path: {_REPLACED_BY} (path)",
    "model_server_metrics_port": "--model-server-metrics-port: will be removed upstream; "
                                 "give the InferencePool's target port the metrics",
    "model_server_metrics_https_insecure_skip_verify":
        f"--model-server-metrics-https-insecure-skip-verify: {_REPLACED_BY} "
        f"(insecureSkipVerify)",
    **{dest: f"--{dest.replace('_', '-')}: use core-metrics-extractor's engineConfigs, or "
              f"label the pods inference.networking.k8s.io/engine-type"
       for dest in _OVERRIDE_KEYS},
}
EPP_IGNORED: dict[str, str] = {
    **IGNORED,
    "refresh_prometheus_metrics_interval":
        "--refresh-prometheus-metrics-interval: pool gauges are computed from the datastore "
        "each time Prometheus scrapes, so there is nothing to flush",
    "enable_cert_reload": "--enable-cert-reload: files in --cert-path are always re-read "
                          "when they change",
}


def metric_spec(text: str) -> str:
    """Validate a metric specification flag (``name{label=value,...}``)."""
    from argparse import ArgumentTypeError

    from epp.metrics.dialects import parse_spec

    if not text.strip():
        return ""  # upstream: an empty spec reads nothing (its chart renders --lora-info-metric=)
    try:
        parse_spec(text)
    except ValueError as e:
        raise ArgumentTypeError(str(e)) from None
    return text


def debug_pool_route(datastore: Datastore, flow_control: FlowController | None = None) -> Any:
    """``/debug/pool``: every endpoint, its latest metrics and age, in-flight counts and
    (with a precise prefix scorer) the blocks its KV events say it holds; with flow control,
    its queues."""

    async def handler(_: web.Request) -> web.Response:
        now = time.monotonic()
        snap = datastore.snapshot
        cached = cached_blocks()
        body: dict[str, Any] = {
            "pool": snap.pool.name if snap.pool else None,
            "synced": datastore.is_synced,
            "endpoints": [
                {
                    # One endpoint, its names: ``name`` (the EPP's, <pod>-rank-<i>, as in the
                    # metrics' model_server_pod), its ``pod`` (pod_name label, what the pod
                    # itself reports, e.g. the simulator's x-inference-pod) and ``address``
                    # (x-gateway-destination-endpoint).
                    "name": v.endpoint.name, "pod": v.endpoint.pod_name, "address": v.key,
                    "role": v.endpoint.labels.get(ROLE_LABEL), "healthy": v.healthy,
                    "age_seconds": None if v.age(now) == float("inf") else round(v.age(now), 3),
                    "waiting": v.metrics.waiting, "running": v.metrics.running,
                    "kv_usage": v.metrics.kv_usage, "queue": v.queue,
                    "inflight_requests": v.inflight_requests,
                    "inflight_tokens": v.inflight_tokens,
                    "prefill_tokens": v.prefill_tokens,
                    "remote_inflight_requests": v.remote_requests,
                    "remote_inflight_tokens": v.remote_tokens,
                    "lora_running": sorted(v.metrics.lora.running) if v.metrics.lora else [],
                    "lora_waiting": sorted(v.metrics.lora.waiting) if v.metrics.lora else [],
                    "max_lora": v.metrics.lora.max_lora if v.metrics.lora else None,
                    "block_size": v.metrics.block_size,
                    "num_gpu_blocks": v.metrics.num_gpu_blocks,
                    "kv_cached_blocks": None if cached is None else cached.get(v.key, 0),
                }
                for v in datastore.views()
            ],
        }
        if flow_control is not None:
            body["flowControl"] = flow_control.snapshot()
        return web.json_response(body)

    return handler


#: The pages of the metrics port, as ``GET /debug`` lists them.
DEBUG_PAGES = {
    "/debug/pool": "the pool: every endpoint (names, P/D role, health, latest metrics and "
                   "their age, in-flight counts, KV blocks held) and flow control's queues",
    "/metrics": "Prometheus metrics (docs/metrics.md)",
}


async def debug_index(_: web.Request) -> web.Response:
    """``/debug``: what the other pages are."""
    return web.json_response({"pages": DEBUG_PAGES})


def settings(args: Any) -> Settings:
    """The flag-given settings plugins see through the handle."""
    return Settings(
        reject_unknown_models=args.reject_unknown_models,
        subset_filter=not args.disable_endpoint_subset_filter,
        staleness=args.metrics_staleness_threshold,
        scraper=ScraperConfig(
            interval=args.refresh_metrics_interval, path=args.model_server_metrics_path,
            port=args.model_server_metrics_port, scheme=args.model_server_metrics_scheme,
            insecure_skip_verify=args.model_server_metrics_https_insecure_skip_verify),
        metric_overrides={key: getattr(args, dest) for dest, key in _OVERRIDE_KEYS.items()
                          if getattr(args, dest) is not None},
        session_token_key=read_session_key(args.session_token_key_file),
        emit_endpoint_scores=args.emit_endpoint_scores,
    )


#: Environment variable holding the state store's shared secret (the chart sets it from a
#: Secret) when ``--state-store-secret-file`` is not given.
STORE_SECRET_ENV = "EPP_STATE_STORE_SECRET"


def state_store_secret(args: Any, url: StoreURL) -> bytes | None:
    """The state store's signing secret (flag file, else env); warns when a shared store
    runs without one, and exits on one that is too short."""
    path = args.state_store_secret_file
    where = f"--state-store-secret-file {path}" if path else STORE_SECRET_ENV
    try:
        secret = (Path(path).read_bytes() if path
                  else os.environ.get(STORE_SECRET_ENV, "").encode()).strip()
    except OSError as e:
        die("epp", f"cannot read --state-store-secret-file {path}: {e.strerror or e}")
    if secret and len(secret) < 16:
        die("epp", f"{where}: the secret must be at least 16 bytes")
    if url.kind != "memory" and not secret:
        log.warning("state store without a shared secret: anyone who can write to it can "
                    "steer picks (set --state-store-secret-file; docs/active-active.md)",
                    store=url.redacted())
    return secret or None


def read_session_key(path: str | None) -> bytes | None:
    """The session-token HMAC key in ``path`` (surrounding whitespace dropped)."""
    if path is None:
        return None
    try:
        key = Path(path).read_bytes().strip()
    except OSError as e:
        die("epp", f"cannot read --session-token-key-file {path}: {e.strerror or e}")
    if len(key) < 16:
        die("epp", f"--session-token-key-file {path}: the key must be at least 16 bytes")
    return key


def load_config(args: Any, path: str | None = None) -> EndpointPickerConfig:
    """The EndpointPickerConfig the flags name (``path`` first); ConfigError if unusable."""
    path = path or args.config_file
    if path:
        return load_config_file(path)
    return parse_config_text(args.config_text, source="--config-text")


def check_plugin_stability(args: Any, runtime: Runtime) -> None:
    """Refuse Alpha plugin types without ``--allow-experimental-plugins`` (as upstream)."""
    try:
        check_stability(((p.name, p.type_name) for p in runtime.handle),
                        allow_experimental=args.allow_experimental_plugins)
    except ExperimentalPluginError as e:
        die("epp", f"bad EndpointPickerConfig: {runtime.config.source}: {e}")


def check_config(args: Any) -> None:
    """``--check-config``: build everything a config names (no serving) and exit 0 or 1."""
    try:
        runtime = build(load_config(args, args.check_config), settings=settings(args))
    except ConfigError as e:
        die("epp", f"bad EndpointPickerConfig: {e}")
    check_plugin_stability(args, runtime)
    print("epp: EndpointPickerConfig is valid")
    sys.exit(0)


def metrics_hooks() -> SchedulerHooks:
    """The scheduler's timings and prefix hits, into the exported metrics."""
    return SchedulerHooks(
        e2e_duration=m.scheduler_e2e,
        plugin_prefix_hit_ratio=m.prefix_hit_ratio,
        plugin_prefix_hit_bytes=m.prefix_hit_bytes,
        plugin_duration=m.plugin_duration,
    )


async def run(args: Any, store_url: StoreURL) -> None:
    """Build everything, serve until SIGTERM."""
    datastore = Datastore()
    flag_settings = settings(args)  # flag files (e.g. the session key) fail before the pool
    try:
        config = load_config(args)
    except ConfigError as e:
        die("epp", f"bad EndpointPickerConfig: {e}")
    discovery = config.discovery is not None
    source, elector = (None, None) if discovery else start_source(args, datastore)
    store = open_store(store_url, pool=store_pool(args, datastore),
                       secret=state_store_secret(args, store_url))
    try:
        runtime = build(config, datastore, flag_settings,
                        rng=random.Random(), hooks=metrics_hooks(), state_store=store)
    except ConfigError as e:
        die("epp", f"bad EndpointPickerConfig: {e}")
    check_plugin_stability(args, runtime)
    if source is None:
        source = start_discovery(args, runtime)
    stop = asyncio.Event()
    connect_notification_sources(args, runtime)
    open_extractors(runtime)
    datastore.subscribe(lambda s: runtime.retain_endpoints(frozenset(e.key for e in s.endpoints)))
    director = Director.of(runtime)
    register_pool_metrics(args, runtime)
    try:
        token = read_token(args.metrics_bearer_token_file)
    except OSError as e:
        die("epp", f"cannot read --metrics-bearer-token-file: {e.strerror or e}")

    servicer = ExtProcServicer(lambda: PickerExchange(director),
                               request_mode=BodyMode.FULL_DUPLEX_STREAMED,
                               response_mode=BodyMode.FULL_DUPLEX_STREAMED,
                               max_body=args.max_body_bytes,
                               max_buffered=args.max_buffered_body_bytes)
    opts = ServeOptions(grpc_port=args.grpc_port, health_port=args.grpc_health_port,
                        host=args.bind_address, secure=args.secure_serving,
                        cert_path=args.cert_path, client_ca=args.client_ca_file,
                        grace=args.grace_period, health_on_grpc_port=args.health_checking,
                        max_message_bytes=message_limit(args.max_body_bytes),
                        max_receive_bytes=args.grpc_max_recv_msg_size,
                        max_send_bytes=args.grpc_max_send_msg_size, drain=args.drain_timeout)

    async def ready(health: Health) -> None:
        await report_readiness(health.set_serving, datastore.synced, elector)

    background: list[Awaitable[None]] = [
        *(s.run(datastore) for s in runtime.data_sources),
        source.run(),
        run_metrics_server(args.metrics_port, host=args.bind_address, token=token,
                           routes={"/debug": debug_index,
                                   "/debug/pool": debug_pool_route(datastore,
                                                                   runtime.flow_control)}),
    ]
    if elector is not None:
        # Sharing ``stop``: a draining leader hands the Lease back at once.
        background.append(elector.run(stop))
    if runtime.flow_control is not None:
        background.append(close_on_stop(runtime.flow_control, stop, datastore))
    if args.ha_mode == "active-active" and store_url.kind == "memory":
        log.warning("active-active without a shared --state-store: each replica routes on "
                    "the picks it made itself")
    # Not fatal when the store is down: the replica routes on local state until it answers.
    await store.start()
    try:
        await serve(servicer, opts, ready=ready, background=background, stop=stop)
    finally:
        await store.close()


def store_pool(args: Any, datastore: Datastore) -> str:
    """``<namespace>/<pool>``: the part of the store's keys that keeps pools apart."""
    pool = datastore.snapshot.pool
    name = args.pool_name or (pool.name if pool else None) or args.endpoint_selector or "pool"
    return f"{args.pool_namespace}/{name}"


async def close_on_stop(flow_control: FlowController, stop: asyncio.Event,
                        datastore: Datastore) -> None:
    """When draining starts, queued requests are answered at once (they would otherwise wait
    out the grace period and be cut off): 503 in a FailClose pool; in a FailOpen pool they are
    released to be scheduled now, as the gateway would pass them without an EPP."""
    await stop.wait()
    pool = datastore.snapshot.pool
    await flow_control.aclose(
        release=pool is not None and pool.failure_mode is FailureMode.FAIL_OPEN)


def connect_notification_sources(args: Any, runtime: Runtime) -> None:
    """Give ``k8s-notification-source`` plugins the Kubernetes API (one line and exit when
    there is none)."""
    from epp.datalayer import K8sNotificationSource

    wanted = [s for s in runtime.data_sources if isinstance(s, K8sNotificationSource)]
    if not wanted:
        return
    if args.manifests is not None:
        die("epp", f"{wanted[0].name} (k8s-notification-source) needs the Kubernetes API, "
                   f"not --manifests")
    from shared.reflector import KubernetesConfigError, load_api_client

    try:
        api = load_api_client()
        for s in wanted:
            s.connect(api, args.pool_namespace)
    except (KubernetesConfigError, ValueError) as e:
        die("epp", str(e))


def open_extractors(runtime: Runtime) -> None:
    """Let endpoint-set extractors bind what they listen on (one line and exit when one
    cannot, e.g. precise-prefix-cache-scorer's zmqEndpoint in use)."""
    from epp.datalayer.endpoint_notification import EndpointSetExtractor

    for extractor in runtime.handle.find(EndpointSetExtractor):
        try:
            extractor.open()
        except ValueError as e:
            die("epp", f"{getattr(extractor, 'name', extractor)}: {e}")


def register_pool_metrics(args: Any, runtime: Runtime) -> None:
    """The pool gauges, computed from the datastore when Prometheus scrapes."""
    # In Kubernetes mode the pool arrives after start; the flag names it either way.
    pool = runtime.datastore.snapshot.pool
    pool_name = args.pool_name or (pool.name if pool else "unknown")
    if runtime.flow_control is not None:
        runtime.flow_control.pool_name = pool_name
    scheduler = runtime.scheduler
    m.register_pool(m.PoolCollector(
        pool_name, runtime.datastore, staleness=args.metrics_staleness_threshold,
        prefix_stats=lambda: scheduler.prefix_indexer_size,
        prefix_sizes=scheduler.prefix_indexer_sizes))


def start_discovery(args: Any, runtime: Runtime) -> Source:
    """``dataLayer.discovery``: the named plugin lists the endpoints (no Kubernetes API, no
    --manifests); exits with one line when it cannot load them."""
    from epp.sources.file_discovery import DiscoveryError, FileDiscovery

    ref = runtime.config.discovery
    assert ref is not None
    if args.manifests is not None or args.endpoint_selector:
        die("epp", "dataLayer.discovery lists the endpoints: drop --manifests / "
                   "--endpoint-selector")
    if args.ha_enable_leader_election or args.ha_mode == "active-passive":
        die("epp", "leader election needs the Kubernetes API, not dataLayer.discovery")
    plugin = runtime.handle.plugin(ref, FileDiscovery)
    plugin.bind(runtime.datastore, pool_name=args.pool_name, namespace=args.pool_namespace)
    try:
        plugin.load()
    except DiscoveryError as e:
        die("epp", f"{ref} (file-discovery): {e}")
    return plugin


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
    # Logs first (to stderr): --check-config's warnings must not mix with its verdict on stdout.
    ls = log_settings(args)
    logs.configure(args.verbosity, json=ls.json, level=ls.level, time_format=ls.time_format)
    if args.check_config is not None:
        check_config(args)
    if args.endpoint_selector and not args.endpoint_target_ports:
        die("epp", "--endpoint-selector needs --endpoint-target-ports")
    report(args, log, EPP_IGNORED, DEPRECATED)
    start_tracing(args, "epp", log)
    m.build_info(buildinfo.commit(), buildinfo.version())
    store_url = state_store_url(args)
    install_uvloop()
    try:
        asyncio.run(run(args, store_url))
    except OSError as e:
        die("epp", f"cannot serve: {e}")
    finally:
        tracing.shutdown()  # the spans still queued go out
    sys.exit(0)


if __name__ == "__main__":
    main()
