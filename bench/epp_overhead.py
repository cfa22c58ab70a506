"""The EPP's cost on the request path: the same chat workload through Envoy straight to a
4-pod pool (round robin), through Envoy + a no-op ext_proc on the same stack (the floor),
and through Envoy + the EPP (default profile, ``override_host`` pool cluster), all
FULL_DUPLEX_STREAMED both ways as upstream runs it. The model servers answer at once, so only
the gateway is measured.

A fourth contender is the same EPP with tracing on at upstream's default sampling
(``--tracing``, ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` at 0.1, OTLP/gRPC export to a
real receiver in this process): the ratio of the two is what tracing costs (target >= 0.95).

    python -m bench.epp_overhead [--seconds 5] [--rounds 3] [--concurrency 32] [--quick]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench.harness import (
    had_errors,
    medians,
    overhead_args,
    ratio_row,
    run_rounds,
    start,
    stop,
    table,
)
from devkit import envoy as e
from devkit.otlp import OtlpReceiver
from devkit.topology import Pool, Topology, bootstrap

PODS = [f"127.0.20.{i}" for i in range(1, 5)]
DUPLEX = "FULL_DUPLEX_STREAMED"
TRACED = "EPP tracing on (10% sampled)"


def manifests(port: int) -> list[dict[str, object]]:
    docs: list[dict[str, object]] = [{
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "bench"},
        "spec": {"selector": {"matchLabels": {"app": "bench"}}, "targetPorts": [{"number": port}],
                 "endpointPickerRef": {"name": "bench-epp", "port": {"number": 9002}}}}]
    docs += [{"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": f"pod-{i}", "labels": {"app": "bench"}},
              "status": {"podIP": ip}} for i, ip in enumerate(PODS)]
    return docs


def echo_pool(work: Path, token_gap_ms: float = 2.0
              ) -> tuple[Path, int, subprocess.Popen[bytes]]:
    """What the gateway benches share, in ``work``: the 0.9 KB chat body (``body.json``), the
    pool's manifests (``pool.yaml``) and the echo pods (one process answering at once on every
    :data:`PODS` address). Returns the body file, the pods' port and their process."""
    body = work / "body.json"
    body.write_bytes(json.dumps({
        "model": "m", "max_tokens": 16,
        "messages": [{"role": "user", "content": "Tell me about Envoy. " * 40}]}).encode())
    port = e.free_port()
    (work / "pool.yaml").write_text(yaml.safe_dump_all(manifests(port)))
    backend = start([sys.executable, "-m", "bench.echo_backend", "--port", str(port),
                     "--token-gap-ms", str(token_gap_ms),
                     *(a for ip in PODS for a in ("--host", ip))], work / "backend.log")
    return body, port, backend


def tracing_cost(results: dict[str, list[dict[str, float]]]) -> str:
    """The traced EPP's CPU per request over the untraced one's, per round (same round: same
    load on the machine) and their median: what tracing costs a CPU-bound EPP's throughput,
    less noisy than req/s on a shared machine."""
    plain = [r["cpu_ms"] for r in results["EPP default profile"]]
    traced = [r["cpu_ms"] for r in results[TRACED]]
    ratios = [t / p for t, p in zip(traced, plain, strict=True) if p > 0]
    return (f"EPP CPU per request, untraced / traced (median of rounds): "
            f"{statistics.median(plain):.3f} / {statistics.median(traced):.3f} ms; "
            f"traced / untraced per round: {', '.join(f'{r:.3f}' for r in ratios)}; "
            f"median {statistics.median(ratios):.3f}")


def paired_cpu(urls: dict[str, str], pids: dict[str, int], body: Path, concurrency: int,
               seconds: float, rounds: int) -> list[float]:
    """Traced / untraced EPP CPU per request with both under load **at the same time** (half
    the connections each, two load generators), so both see the same machine; per round."""
    from concurrent.futures import ThreadPoolExecutor

    from bench.cpubudget import cpu_seconds
    from bench.harness import load

    names = ["EPP default profile", TRACED]
    ratios = []
    with ThreadPoolExecutor(2) as pool:
        for _ in range(rounds):
            before = {n: cpu_seconds(pids[n]) for n in names}
            runs = list(pool.map(lambda n: load(urls[n], body, max(concurrency // 2, 1),
                                                seconds), names))
            per = [(cpu_seconds(pids[n]) - before[n]) / max(r["requests"], 1)
                   for n, r in zip(names, runs, strict=True)]
            ratios.append(per[1] / per[0])
    return ratios


def main() -> None:
    args = overhead_args(__doc__)

    work = Path(tempfile.mkdtemp(prefix="bench-epp-"))
    body, backend_port, backend = echo_pool(work)
    ports = {name: e.free_port() for name in ("noop", "noop_h", "epp", "epp_h", "epp_m",
                                              "eppt", "eppt_h", "eppt_m")}
    py = sys.executable
    receiver = OtlpReceiver(count_only=True).start()  # answers as quickly as a collector
    traced_env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                  "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                  "OTEL_TRACES_SAMPLER_ARG": "0.1"}
    procs = [
        backend,
        start([py, "-m", "bench.noop_extproc", "--grpc-port", str(ports["noop"]),
               "--grpc-health-port", str(ports["noop_h"])], work / "noop.log"),
        start([py, "-m", "epp.main", "--secure-serving=false", "--manifests",
               str(work / "pool.yaml"), "--grpc-port", str(ports["epp"]),
               "--grpc-health-port", str(ports["epp_h"]), "--metrics-port", str(ports["epp_m"])],
              work / "epp.log"),
        start([py, "-m", "epp.main", "--secure-serving=false", "--manifests",
               str(work / "pool.yaml"), "--grpc-port", str(ports["eppt"]),
               "--grpc-health-port", str(ports["eppt_h"]),
               "--metrics-port", str(ports["eppt_m"]), "--tracing=true"],
              work / "epp-traced.log", env_extra=traced_env),
    ]
    pods = [(ip, backend_port) for ip in PODS]
    listen = {name: e.free_port() for name in ("direct", "noop", "epp", "eppt")}
    admin = e.free_port()
    # One Envoy, three listeners (devkit.topology): straight to the pods, through the no-op
    # ext_proc (observes every request, Envoy balances), through the EPP (it picks).
    cfg = bootstrap([
        Topology(listen=listen["direct"], admin=admin, name="direct", mode=DUPLEX,
                 pools=[Pool("direct", cluster="pods", endpoints=pods)]),
        Topology(listen=listen["noop"], admin=admin, name="noop", mode=DUPLEX, pools=[Pool(
            "noop", cluster="pods", epp_cluster="noop", epp_port=ports["noop"],
            endpoints=pods, epp_picks=False)]),
        Topology(listen=listen["epp"], admin=admin, name="epp", mode=DUPLEX, pools=[Pool(
            "pool", cluster="pool", epp_cluster="epp", epp_port=ports["epp"],
            endpoints=pods)]),
        Topology(listen=listen["eppt"], admin=admin, name="eppt", mode=DUPLEX, pools=[Pool(
            "pool-traced", cluster="pool", epp_cluster="epp-traced", epp_port=ports["eppt"],
            endpoints=pods)]),
    ])
    contenders = {
        "envoy direct (round robin)": listen["direct"],
        "no-op ext_proc (floor)": listen["noop"],
        "EPP default profile": listen["epp"],
        TRACED: listen["eppt"],
    }
    urls = {k: f"http://127.0.0.1:{v}/v1/chat/completions" for k, v in contenders.items()}
    try:
        for port in (ports["noop"], ports["epp"], ports["eppt"], backend_port):
            e.wait_for_port(port, timeout=60,
                            host="127.0.0.1" if port != backend_port else PODS[0])
        with e.Envoy(cfg, admin_port=admin, workdir=work / "envoy"):
            pids = {"EPP default profile": procs[2].pid, TRACED: procs[3].pid}
            results = run_rounds(urls, body, args.concurrency, args.seconds, args.rounds,
                                 pids=pids)
            paired = paired_cpu(urls, pids, body, args.concurrency, args.seconds, args.rounds)
    finally:
        stop(procs)
        receiver.stop()
    med = medians(results)
    print("\n".join([
        f"Workload: closed loop, {args.concurrency} connections, {args.seconds:g} s x "
        f"{args.rounds} rounds per contender, 0.9 KB chat body, 4 pods answering at once, "
        "services plaintext.", "", *table(med), "",
        "| | EPP / floor throughput | EPP / floor p50 | EPP / floor p99 |",
        "|---|---:|---:|---:|",
        ratio_row("FULL_DUPLEX_STREAMED", med["EPP default profile"],
                  med["no-op ext_proc (floor)"]),
        "",
        "| | traced / untraced EPP throughput | p50 | p99 |",
        "|---|---:|---:|---:|",
        ratio_row("tracing on, 10% sampled", med[TRACED], med["EPP default profile"]),
        "",
        tracing_cost(results),
        "Both EPPs loaded at once (half the connections each), traced / untraced CPU per "
        f"request per round: {', '.join(f'{r:.3f}' for r in paired)}; "
        f"median {statistics.median(paired):.3f}",
        f"Spans received from the traced EPP: {receiver.count}",
    ]))
    if had_errors(results):
        sys.exit("errors during the run")


if __name__ == "__main__":
    main()
