"""Resident memory each request leaves behind in BBR and the EPP, through the real gateway
(Envoy → BBR → EPP → ``vllm-sim``, 4 pods), with Envoy's default ext_proc stream close (a
half-close then an immediate reset) and with graceful close (``devkit.envoy.GRACEFUL_CLOSE``:
Envoy half-closes and waits for the service's status).

    python -m bench.rss_per_request [--seconds 60] [--concurrency 32]

grpc.aio leaks the native memory of a batch that a stream reset fails or cancels
(grpc/grpc#43360); the services end their streams themselves to stay out of that race
(``shared/extproc.py``), and graceful close removes it. The figure is RSS growth over the
measured run divided by its requests, after a warm-up run of a quarter of its length. The
graceful-close run is the baseline; each run starts fresh processes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench.harness import load
from devkit.envoy import GRACEFUL_CLOSE
from devkit.reliability.faultkit import MODEL, SimFleet, start_sim_gateway
from devkit.reliability.gateway import rss_kb


def measure(runtime: dict[str, Any] | None, seconds: float, concurrency: int
            ) -> dict[str, Any]:
    """Bytes of RSS per request for each service, and the run's request and error counts."""
    workdir = Path(tempfile.mkdtemp(prefix="rss-per-request-"))
    body = workdir / "body.json"
    body.write_bytes(orjson.dumps({"model": MODEL, "max_tokens": 2, "prompt": "leak probe"}))
    fleet = SimFleet(4, workdir).start()
    gw = start_sim_gateway(workdir, fleet, runtime=runtime)
    procs = {"bbr": gw.bbr.proc, "epp": gw.epps["sim"].proc}
    pids = {name: proc.pid for name, proc in procs.items() if proc is not None}
    try:
        load(gw.url(), body, concurrency, seconds / 4)
        before = {name: rss_kb(pid) for name, pid in pids.items()}
        stats = load(gw.url(), body, concurrency, seconds)
        after = {name: rss_kb(pid) for name, pid in pids.items()}
    finally:
        gw.stop()
        fleet.stop()
    n = max(1, stats["requests"])
    return {"requests": stats["requests"], "errors": stats["errors"],
            **{name: (after[name] - before[name]) * 1024 / n for name in pids}}


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench.rss_per_request", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    default = measure(None, args.seconds, args.concurrency)
    graceful = measure(GRACEFUL_CLOSE, args.seconds, args.concurrency)
    print(f"Closed loop, {args.concurrency} connections, {args.seconds:g} s measured after "
          f"{args.seconds / 4:g} s of warm-up; requests: {default['requests']} (Envoy default), "
          f"{graceful['requests']} (graceful close); errors: {default['errors']}, "
          f"{graceful['errors']}.\n")
    print("| service | Envoy default, B/request | graceful close, B/request |")
    print("|---|---:|---:|")
    for name in ("bbr", "epp"):
        print(f"| {name} | {default[name]:.0f} | {graceful[name]:.0f} |")
    if default["errors"] or graceful["errors"]:
        sys.exit("errors during the run")


if __name__ == "__main__":
    main()
