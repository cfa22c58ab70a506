"""``pd-sidecar``: the P/D routing sidecar that runs beside each decode server (docs/pd.md).

Flags follow llm-d's ``pd-sidecar`` where the behaviour is the same (``--port``, ``--vllm-
port``, ``--kv-connector``, ``--ec-connector``, ``--enable-ssrf-protection``, ``--inference-
pool``, ``--pool-group``, ``--enable-prefiller-sampling``); ``--manifests``, ``--prefill-
timeout``, ``--vllm-host`` and ``--metrics-port`` are ours. SSRF protection is on by default
here (llm-d: off).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import structlog
from aiohttp import web

from epp.datastore import Datastore
from epp.sources import ManifestError, ManifestSource
from shared import logs
from shared.flags import Parser, boolean, die, duration
from shared.metrics_server import run_metrics_server
from shared.server import install_uvloop
from sidecar.allowlist import AllowAny, PoolPrefillers, PrefillerPolicy
from sidecar.proxy import EC_CONNECTORS, KV_CONNECTORS, Sidecar, SidecarConfig, SidecarMetrics

log = structlog.get_logger("sidecar")

PROG = "pd-sidecar"
#: llm-d's connectors implemented here (its ``sglang`` one is not).
_LLMD_ONLY = ("sglang",)


def parser() -> Parser:
    """The command line."""
    p = Parser(prog=PROG, description=__doc__)
    p.add_argument("--port", type=int, default=8000, help="port the sidecar listens on")
    p.add_argument("--vllm-port", type=int, default=8001,
                   help="port of the local decode server (on --vllm-host)")
    p.add_argument("--vllm-host", default="127.0.0.1",
                   help="address of the local decode server (the pod's own: 127.0.0.1; the "
                   "local stack gives each simulated pod its own loopback IP)")
    p.add_argument("--kv-connector", default="nixlv2",
                   help=f"P/D protocol between prefiller and decoder: {', '.join(KV_CONNECTORS)}")
    p.add_argument("--ec-connector", default="",
                   help="E/PD, E/P/D: the protocol between encoder and prefill/decode server "
                   f"({', '.join(EC_CONNECTORS)}: vLLM's ECSharedStorageConnector); empty "
                   "(default): no encode stage, x-encoder-hosts-ports is ignored")
    p.add_bool("--enable-ssrf-protection", default=True,
               help="send prefill legs only to prefill endpoints of the pool")
    p.add_argument("--inference-pool", default=os.environ.get("INFERENCE_POOL"),
                   metavar="[NAMESPACE/]NAME",
                   help="the InferencePool whose prefill pods are allowed (env INFERENCE_POOL; "
                   "namespace defaults to default)")
    p.add_argument("--pool-group", default="inference.networking.k8s.io",
                   help="API group of the InferencePool")
    p.add_argument("--manifests", default=None, metavar="PATH",
                   help="read the pool and its pods from this YAML file or directory instead "
                   "of the Kubernetes API (as the EPP's --manifests)")
    p.add_bool("--enable-prefiller-sampling",
               default=boolean(os.environ.get("ENABLE_PREFILLER_SAMPLING", "false")),
               help="pick a random allowed prefiller among the header's entries, not the first")
    p.add_bool("--enable-p2p-pull", default=False,
               help="honour x-kv-cache-source-host-port: the pod computing the prompt pulls "
               "the cached prefix from that pool endpoint (llm-d-router v0.10; nixlv2 only)")
    p.add_argument("--p2p-connector-port", type=int, default=7777,
                   help="port of the servers' P2P KV tier (0: the port the header names, as "
                   "the simulator serves pulls on its HTTP port)")
    p.add_argument("--prefill-timeout", type=duration, default=60.0,
                   help="give up on a prefill leg after this long and decode locally")
    p.add_argument("--metrics-port", type=int, default=9090,
                   help="port of the sidecar's own Prometheus metrics, on --host (0: off)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("-v", "--verbosity", type=int, default=0, help="log verbosity (4+: debug)")
    return p


def _pool_ref(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep:
        namespace, name = "default", text
    if not namespace or not name or "/" in name:
        raise ValueError(f"--inference-pool must be NAME or NAMESPACE/NAME, got {text!r}")
    return namespace, name


def build_policy(args: Any, datastore: Datastore) -> tuple[PrefillerPolicy, Any]:
    """The prefiller policy and the source task's coroutine (``None``: nothing to run).

    Exits with one line when SSRF protection has no pool to read.
    """
    if not args.enable_ssrf_protection:
        log.warning("SSRF protection is off: any x-prefiller-host-port is honoured")
        return AllowAny(), None
    namespace, name = "default", None
    if args.inference_pool:
        try:
            namespace, name = _pool_ref(args.inference_pool)
        except ValueError as e:
            die(PROG, str(e))
    if args.manifests is not None:
        source = ManifestSource(args.manifests, datastore, pool_name=name,
                                pool_namespace=namespace)
        try:
            source.load()
        except ManifestError as e:
            die(PROG, str(e))
        return PoolPrefillers(datastore), source.run()
    if name is None:
        die(PROG, "--enable-ssrf-protection needs --inference-pool (or INFERENCE_POOL) or "
            "--manifests; or turn it off with --enable-ssrf-protection=false")
    # Imported here so --manifests never loads the Kubernetes client.
    from epp.sources.kubernetes import KubernetesSource
    from shared.reflector import KubernetesConfigError, load_api_client

    try:
        k8s = KubernetesSource(datastore, name, namespace, args.pool_group,
                               api_client=load_api_client())
    except (KubernetesConfigError, ValueError) as e:
        die(PROG, str(e))
    return PoolPrefillers(datastore), k8s.run()


async def run(args: Any) -> None:
    """Serve until SIGTERM/SIGINT."""
    datastore = Datastore()
    policy, source = build_policy(args, datastore)
    metrics = SidecarMetrics()
    sidecar = Sidecar(SidecarConfig(decoder_url=f"http://{args.vllm_host}:{args.vllm_port}",
                                    prefiller_sampling=args.enable_prefiller_sampling,
                                    prefill_timeout=args.prefill_timeout,
                                    kv_connector=args.kv_connector,
                                    ec_connector=args.ec_connector,
                                    enable_p2p_pull=args.enable_p2p_pull,
                                    p2p_connector_port=args.p2p_connector_port),
                      policy, metrics)
    runner = web.AppRunner(sidecar.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    tasks = [asyncio.create_task(c) for c in (
        source,
        run_metrics_server(args.metrics_port, host=args.host, registry=metrics.registry)
        if args.metrics_port else None) if c is not None]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("pd-sidecar ready", port=args.port, decoder=args.vllm_port,
             ssrf_protection=args.enable_ssrf_protection)
    print(f"pd-sidecar ready on {args.host}:{args.port}", flush=True)
    try:
        await stop.wait()
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = parser().parse_args(argv)
    if args.kv_connector not in KV_CONNECTORS:
        if args.kv_connector in _LLMD_ONLY:
            die(PROG, f"--kv-connector {args.kv_connector} is llm-d's, not implemented here "
                f"(supported: {', '.join(KV_CONNECTORS)})")
        die(PROG, f"--kv-connector must be one of {', '.join(KV_CONNECTORS)}, "
            f"got {args.kv_connector!r}")
    if args.ec_connector not in ("", *EC_CONNECTORS):
        if args.ec_connector == "ec-nixl":
            die(PROG, "--ec-connector ec-nixl is llm-d's, not implemented here "
                f"(supported: {', '.join(EC_CONNECTORS)})")
        die(PROG, f"--ec-connector must be one of {', '.join(EC_CONNECTORS)}, "
            f"got {args.ec_connector!r}")
    for flag in ("port", "vllm_port"):
        if not 0 < getattr(args, flag) < 65536:
            die(PROG, f"--{flag.replace('_', '-')} must be a port number")
    if not 0 <= args.metrics_port < 65536:
        die(PROG, "--metrics-port must be a port number (0: off)")
    if args.prefill_timeout <= 0:
        die(PROG, "--prefill-timeout must be positive")
    if not 0 <= args.p2p_connector_port < 65536:
        die(PROG, "--p2p-connector-port must be a port number (0: the header's)")
    if args.enable_p2p_pull and args.kv_connector != "nixlv2":
        die(PROG, "--enable-p2p-pull needs --kv-connector nixlv2")
    logs.configure(args.verbosity)
    install_uvloop()
    try:
        asyncio.run(run(args))
    except OSError as e:
        die(PROG, f"cannot serve: {e}")


if __name__ == "__main__":
    main()
