"""Slow clients and concurrent streams against the real gateway (issue 31, item 1).

``python -m bench.overload [--slow 5000] [--streams 3000]``: Envoy + BBR + EPP (TLS,
FULL_DUPLEX_STREAMED) in front of a ``vllm-sim`` fleet of 4 with the gateway's default
limits (:mod:`devkit.overload`). Phase 1 opens ``--slow`` clients that send headers and half
a body, then stall, and sends ``--legit`` ordinary requests meanwhile; phase 2 sends
``--streams`` streaming completions at once. Prints JSON: every answer classified (200,
``<status> json`` = OpenAI-shaped refusal, ``<status> bare``), peak RSS of Envoy, BBR and the
EPP. Not in CI (minutes of CPU on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from devkit.reliability.faultkit import MODEL, SimFleet, start_sim_gateway
from devkit.reliability.gateway import rss_kb
from devkit.reliability.slowclients import legit_requests, open_slow


class PeakRSS:
    """Peak resident memory of some processes, sampled every 0.2 s in a thread."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = {n: max(self.peak[n], rss_kb(p)) for n, p in self.pids.items()}

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def mib(self) -> dict[str, float]:
        return {k: round(v / 1024, 1) for k, v in self.peak.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slow", type=int, default=5000)
    ap.add_argument("--legit", type=int, default=400)
    ap.add_argument("--streams", type=int, default=3000)
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds between opening the slow clients and the legitimate "
                         "requests (0: at once, while BBR still takes the slow streams in)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    fleet = SimFleet(4, workdir).start()
    gw = start_sim_gateway(workdir, fleet)
    result: dict[str, Any] = {"slow_clients": args.slow, "streams": args.streams}
    try:
        pids = {"envoy": gw.envoy.proc.pid, "bbr": gw.bbr.proc.pid,  # type: ignore[union-attr]
                "epp": gw.epps["sim"].proc.pid}  # type: ignore[union-attr]
        base = {k: round(rss_kb(p) / 1024, 1) for k, p in pids.items()}
        with PeakRSS(pids) as peak:
            started = time.monotonic()
            slow = open_slow(gw.listen, args.slow, model=MODEL)
            opened = time.monotonic() - started
            time.sleep(args.settle)
            legit = asyncio.run(legit_requests(gw.url(), args.legit, 8, model=MODEL))
            held = peak.mib()
            ext_proc = {k.rpartition(".")[2]: v for k, v in gw.envoy.stats("ext_proc").items()
                        if v and k.endswith(("timeouts", "failed", "started"))}
            for s in slow:
                s.close()
        result["phase1"] = {"open_seconds": round(opened, 1), "settle_seconds": args.settle,
                            "legit": dict(legit.counts),
                            "legit_ok_ratio": round(legit.ok / max(1, legit.total), 4),
                            "rss_before_mib": base, "rss_peak_mib": held,
                            "envoy_ext_proc": ext_proc}
        time.sleep(2)
        with PeakRSS(pids) as peak:
            started = time.monotonic()
            streams = asyncio.run(legit_requests(gw.url(), args.streams, args.streams,
                                                 model=MODEL, stream=True, timeout=300))
            took = time.monotonic() - started
        result["phase2"] = {"seconds": round(took, 1), "answers": dict(streams.counts),
                            "bare": streams.bare, "rss_peak_mib": peak.mib()}
    finally:
        gw.stop()
        if fleet.proc is not None:
            fleet.proc.terminate()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
