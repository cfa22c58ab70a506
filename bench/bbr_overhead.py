"""BBR's cost: the same POST workload through Envoy direct, Envoy + a no-op ext_proc on the
same stack (the floor), and Envoy + BBR, in BUFFERED and FULL_DUPLEX_STREAMED modes.

    python -m bench.bbr_overhead [--seconds 5] [--rounds 3] [--concurrency 32] [--quick]

Contenders run interleaved in rounds (the machine is shared and noisy); each figure is the
median over rounds. Printed as a Markdown table with BBR / floor ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shared import envoy as e
from tests.support import wait_for_port

MODES = ("BUFFERED", "FULL_DUPLEX_STREAMED")


def direct_route() -> dict[str, Any]:
    return {"match": {"prefix": "/"},
            "direct_response": {"status": 200, "body": {"inline_string": '{"ok":true}'}}}


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--quick", action="store_true", help="one short round (CI smoke)")
    args = p.parse_args()
    if args.quick:
        args.seconds, args.rounds = 1.0, 1

    work = Path(tempfile.mkdtemp(prefix="bench-bbr-"))
    body = work / "body.json"
    body.write_bytes(json.dumps({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "Tell me about Envoy. " * 40}],
        "max_tokens": 64, "stream": False}).encode())

    ports = {name: e.free_port() for name in ("noop", "noop_h", "bbr", "bbr_h", "bbr_m")}
    procs = [
        start([sys.executable, "-m", "bench.noop_extproc", "--grpc-port", str(ports["noop"]),
               "--grpc-health-port", str(ports["noop_h"])], work / "noop.log"),
        start([sys.executable, "-m", "bbr.main", "--secure-serving=false",
               "--grpc-port", str(ports["bbr"]), "--grpc-health-port", str(ports["bbr_h"]),
               "--metrics-port", str(ports["bbr_m"])], work / "bbr.log"),
    ]
    listeners, contenders = [], {}
    for mode in MODES:
        for svc in ("noop", "bbr"):
            port = e.free_port()
            listeners.append(e.listener(port, [direct_route()],
                                        [e.ext_proc_filter(svc, request_body_mode=mode)],
                                        name=f"{svc}_{mode}"))
            contenders[f"{svc} {mode}"] = port
    port = e.free_port()
    listeners.append(e.listener(port, [direct_route()], [], name="direct"))
    contenders["envoy direct"] = port
    admin = e.free_port()
    cfg = e.bootstrap(admin, listeners, [e.grpc_cluster("noop", ports["noop"], tls=False),
                                         e.grpc_cluster("bbr", ports["bbr"], tls=False)])
    results: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    try:
        wait_for_port(ports["noop"])
        wait_for_port(ports["bbr"])
        with e.Envoy(cfg, admin_port=admin, workdir=work / "envoy"):
            for rnd in range(args.rounds):
                order = list(contenders) if rnd % 2 == 0 else list(reversed(contenders))
                for name in order:
                    url = f"http://127.0.0.1:{contenders[name]}/v1/chat/completions"
                    out = subprocess.run(
                        [sys.executable, "-m", "bench.loadgen", url, str(body),
                         str(args.concurrency), str(args.seconds)],
                        capture_output=True, text=True, check=True)
                    stats = json.loads(out.stdout)
                    stats["rps"] = stats["requests"] / stats["seconds"]
                    results[name].append(stats)
                    print(f"round {rnd + 1} {name:28s} {stats['rps']:8.0f} req/s "
                          f"p50 {stats['p50_ms']:.2f} ms p99 {stats['p99_ms']:.2f} ms "
                          f"errors {stats['errors']}", file=sys.stderr)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
    print(report(results, args))
    if any(s["errors"] for runs in results.values() for s in runs):
        sys.exit("errors during the run")


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> str:
    med = {name: {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50_ms", "p99_ms")}
           for name, runs in results.items()}
    lines = [
        f"Workload: closed loop, {args.concurrency} connections, {args.seconds:g} s x "
        f"{args.rounds} rounds per contender, 1.3 KB chat body, Envoy answers directly "
        "(no model server), services plaintext.",
        "",
        "| contender | req/s | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
    ]
    for name, m in med.items():
        lines.append(f"| {name} | {m['rps']:.0f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} |")
    lines += ["", "| mode | BBR / floor throughput | BBR / floor p50 | BBR / floor p99 |",
              "|---|---:|---:|---:|"]
    for mode in MODES:
        b, n = med[f"bbr {mode}"], med[f"noop {mode}"]
        lines.append(f"| {mode} | {b['rps'] / n['rps']:.2f} | {b['p50_ms'] / n['p50_ms']:.2f} | "
                     f"{b['p99_ms'] / n['p99_ms']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    time.sleep(0)
    main()
