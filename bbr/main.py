"""``bbr``: the body-based router's command line (upstream flag names and defaults)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import structlog

from bbr import configmaps, metrics
from bbr.basemodels import BaseModelError, FileBaseModels, StaticBaseModels
from bbr.models import ModelListing
from bbr.plugins import PluginSpecError, build
from bbr.router import BodyRouter
from shared import buildinfo, logs, tracing
from shared.extproc import DEFAULT_MAX_BODY, DEFAULT_MAX_BUFFERED, BodyMode, ExtProcServicer
from shared.flags import Parser, byte_size, die
from shared.metrics_server import read_token, run_metrics_server
from shared.server import Health, ServeOptions, install_uvloop, message_limit, serve
from shared.upstream_flags import (
    add_diagnostics_flags,
    add_logging_flags,
    log_settings,
    report,
    start_tracing,
)


def parser() -> Parser:
    p = Parser(prog="bbr", description="Body-based router: an Envoy ext_proc service that "
               "copies the request body's model into the X-Gateway-Model-Name header.")
    p.add_argument("--grpc-port", type=int, default=9004, help="ext_proc gRPC port")
    p.add_argument("--grpc-health-port", type=int, default=9005, help="gRPC health port")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port")
    p.add_argument("--bind-address", default="0.0.0.0", metavar="HOST",
                   help="address the ext_proc, health and metrics ports listen on (ours; "
                        "default every interface, as in a pod; gateway-stack: 127.0.0.1)")
    p.add_bool("--streaming", default=False,
               help="Envoy sends bodies FULL_DUPLEX_STREAMED (else BUFFERED)")
    p.add_bool("--secure-serving", default=True, help="serve ext_proc over TLS")
    p.add_argument("--cert-path", default=None,
                   help="directory with tls.crt and tls.key (reloaded on change); "
                        "default: a self-signed certificate")
    p.add_argument("--client-ca-file", default=None, metavar="FILE",
                   help="PEM CA bundle: the ext_proc port then requires a client certificate "
                        "it signed (mTLS; the gateway's Envoy presents one)")
    p.add_argument("--plugin", action="append", default=[], metavar="TYPE:NAME[:JSON]",
                   help="a plugin to run, repeatable (default: body-field-to-header and "
                        "base-model-to-header)")
    p.add_argument("--base-models", default=None, metavar="FILE",
                   help="YAML list of {baseModel, adapters} for base-model-to-header")
    configmaps.add_flags(p)
    p.add_bool("--models-endpoint", default=True,
               help="answer GET /v1/models (and /v1/models/ID) with every base model and "
                    "adapter the base-model mappings name (nothing known: passed on)")
    p.add_bool("--require-model", default=True,
               help="answer 400 (missing_model / invalid_model, OpenAI JSON) to a JSON body "
                    "without a non-empty string 'model'; false: pass it on without the "
                    "header, as upstream does")
    p.add_argument("--max-body-bytes", type=byte_size, default=DEFAULT_MAX_BODY,
                   metavar="SIZE", help="largest request body accepted, e.g. 10485760 or "
                                        "32MiB; bigger gets a JSON 413 (default 10MiB)")
    p.add_argument("--max-buffered-body-bytes", type=byte_size, default=DEFAULT_MAX_BUFFERED,
                   metavar="SIZE",
                   help="request-body bytes all streams may hold at once (bounds memory under "
                        "many concurrent uploads); a chunk over it gets a JSON 503; 0: no bound")
    p.add_argument("--grpc-max-recv-msg-size", type=byte_size, default=None, metavar="SIZE",
                   help="largest gRPC message received, e.g. 10MiB or 25MB (default: "
                        "max(--max-body-bytes, 64MiB) + 1MiB); a BUFFERED body is one message")
    p.add_argument("--grpc-max-send-msg-size", type=byte_size, default=None, metavar="SIZE",
                   help="largest gRPC message sent (default: max(--max-body-bytes, 64MiB) "
                        "+ 1MiB)")
    p.add_argument("--metrics-bearer-token-file", default=None,
                   help="require 'Authorization: Bearer <token>' on the metrics port")
    p.add_argument("--grace-period", type=float, default=30.0,
                   help="seconds in-flight streams get to finish on SIGTERM")
    p.add_argument("-v", "--v", dest="verbosity", type=int, nargs="?", const=4, default=0,
                   help="log verbosity (4 and above: debug)")
    add_diagnostics_flags(p)
    add_logging_flags(p)
    return p


def ready_when_synced(watch: configmaps.ConfigMapWatch) -> Callable[[Health], Awaitable[None]]:
    """Health turns SERVING once the ConfigMaps have been listed."""

    async def ready(health: Health) -> None:
        await asyncio.to_thread(watch.wait_synced)
        await health.set_serving(True)

    return ready


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    ls = log_settings(args)
    logs.configure(args.verbosity, json=ls.json, level=ls.level, time_format=ls.time_format)
    report(args, structlog.get_logger("bbr"))
    start_tracing(args, "bbr", structlog.get_logger("bbr"))
    if args.base_models and args.base_models_from_configmaps:
        die("bbr", "--base-models and --base-models-from-configmaps exclude each other")
    try:
        base_models = FileBaseModels(args.base_models) if args.base_models else StaticBaseModels()
        plugins = build(args.plugin, base_models)
    except (BaseModelError, PluginSpecError) as e:
        die("bbr", str(e))
    watch = None
    if args.base_models_from_configmaps:
        # Imported here so a plain bbr never loads the Kubernetes client.
        from shared.reflector import KubernetesConfigError, load_api_client

        try:
            watch = configmaps.start_configmap_watch(
                base_models, args.configmap_namespace or None, load_api_client())
        except KubernetesConfigError as e:
            die("bbr", str(e))
    try:
        token = read_token(args.metrics_bearer_token_file)
    except OSError as e:
        die("bbr", f"cannot read --metrics-bearer-token-file: {e.strerror or e}")
    metrics.INFO.labels(commit=buildinfo.commit(), build_ref=buildinfo.version()).set(1)
    router = BodyRouter(plugins, ModelListing(base_models) if args.models_endpoint else None,
                        require_model=args.require_model)
    mode = BodyMode.FULL_DUPLEX_STREAMED if args.streaming else BodyMode.BUFFERED
    servicer = ExtProcServicer(router.exchange, request_mode=mode, max_body=args.max_body_bytes,
                               max_buffered=args.max_buffered_body_bytes)
    opts = ServeOptions(
        grpc_port=args.grpc_port, health_port=args.grpc_health_port, host=args.bind_address,
        secure=args.secure_serving, cert_path=args.cert_path, client_ca=args.client_ca_file,
        grace=args.grace_period,
        max_message_bytes=message_limit(args.max_body_bytes),
        max_receive_bytes=args.grpc_max_recv_msg_size,
        max_send_bytes=args.grpc_max_send_msg_size,
    )
    structlog.get_logger("bbr").info(
        "starting", plugins=[f"{p.type_name}:{p.name}" for p in plugins], mode=mode.name)
    install_uvloop()
    try:
        metrics_server = run_metrics_server(args.metrics_port, host=args.bind_address,
                                            token=token)
        asyncio.run(serve(servicer, opts, background=[metrics_server],
                          ready=None if watch is None else ready_when_synced(watch)))
    except OSError as e:
        die("bbr", f"cannot serve: {e}")
    finally:
        if watch is not None:
            watch.stop()
        tracing.shutdown()  # the spans still queued go out
    sys.exit(0)


if __name__ == "__main__":
    main()
