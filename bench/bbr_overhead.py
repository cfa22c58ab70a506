"""BBR's cost: the same POST workload through Envoy direct, Envoy + a no-op ext_proc on the
same stack (the floor), and Envoy + BBR, in BUFFERED and FULL_DUPLEX_STREAMED modes.

    python -m bench.bbr_overhead [--seconds 5] [--rounds 3] [--concurrency 32] [--quick]

Contenders run interleaved in rounds (the machine is shared and noisy); each figure is the
median over rounds. Printed as a Markdown table with BBR / floor ratios.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

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

MODES = ("BUFFERED", "FULL_DUPLEX_STREAMED")


def direct_route() -> dict[str, Any]:
    return {"match": {"prefix": "/"},
            "direct_response": {"status": 200, "body": {"inline_string": '{"ok":true}'}}}


def main() -> None:
    args = overhead_args(__doc__)

    work = Path(tempfile.mkdtemp(prefix="bench-bbr-"))
    body = work / "body.json"
    body.write_bytes(json.dumps({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "Tell me about Envoy. " * 40}],
        "max_tokens": 64, "stream": False}).encode())

    ports = {name: e.free_port() for name in ("noop", "noop_h", "bbr", "bbr_h", "bbr_m")}
    py = sys.executable
    procs = [
        start([py, "-m", "bench.noop_extproc", "--grpc-port", str(ports["noop"]),
               "--grpc-health-port", str(ports["noop_h"])], work / "noop.log"),
        start([py, "-m", "bbr.main", "--secure-serving=false",
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
            contenders[f"{svc} {mode}"] = f"http://127.0.0.1:{port}/v1/chat/completions"
    port = e.free_port()
    listeners.append(e.listener(port, [direct_route()], [], name="direct"))
    contenders["envoy direct"] = f"http://127.0.0.1:{port}/v1/chat/completions"
    admin = e.free_port()
    cfg = e.bootstrap(admin, listeners, [e.grpc_cluster("noop", ports["noop"], tls=False),
                                         e.grpc_cluster("bbr", ports["bbr"], tls=False)])
    try:
        e.wait_for_port(ports["noop"])
        e.wait_for_port(ports["bbr"])
        with e.Envoy(cfg, admin_port=admin, workdir=work / "envoy"):
            results = run_rounds(contenders, body, args.concurrency, args.seconds, args.rounds)
    finally:
        stop(procs)
    med = medians(results)
    print("\n".join([
        f"Workload: closed loop, {args.concurrency} connections, {args.seconds:g} s x "
        f"{args.rounds} rounds per contender, 1.3 KB chat body, Envoy answers directly "
        "(no model server), services plaintext.", "", *table(med), "",
        "| mode | BBR / floor throughput | BBR / floor p50 | BBR / floor p99 |",
        "|---|---:|---:|---:|",
        *(ratio_row(mode, med[f"bbr {mode}"], med[f"noop {mode}"]) for mode in MODES),
    ]))
    if had_errors(results):
        sys.exit("errors during the run")


if __name__ == "__main__":
    main()
