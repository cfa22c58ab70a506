"""Slow clients and concurrent streams against the real gateway (issue 31, item 1).

``python -m bench.overload [--slow 5000] [--streams 3000] [--settle 0]``: Envoy + BBR + EPP
(TLS, FULL_DUPLEX_STREAMED) in front of a ``vllm-sim`` fleet of 4 with the gateway's default
limits (:mod:`devkit.overload`). Phase 1 opens ``--slow`` clients that send headers and half
a body, then stall, and sends 400 ordinary requests meanwhile; phase 2 sends
``--streams`` streaming completions at once. Prints JSON: every answer classified (200,
``<status> json`` = OpenAI-shaped refusal, ``<status> bare``), peak RSS of Envoy, BBR and the
EPP. Not in CI (minutes of CPU on 2 cores).

``python -m bench.overload --bodies`` (issue 31, items 6 and 7): large uploads at once. For
each body mode (BUFFERED, FULL_DUPLEX_STREAMED) and size (20 and 100 MB), Envoy + BBR + EPP
(TLS, default caps: 10 MiB body, 256 MiB of bodies held per service) in front of one
``vllm-sim`` pod; 100 uploads start at once, each writing its body in 1 MiB pieces. Prints
JSON lines: answers by status as the client read them (``reset`` = the connection closed
before the client could read an answer: Envoy answers early and closes while a large body is
still being sent), what Envoy counted as answered (2xx/4xx/5xx) and the peak RSS of BBR, the
EPP and Envoy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from typing import Any

from bench.harness import service_pids, sim_gateway
from devkit.reliability.faultkit import MODEL
from devkit.reliability.gateway import rss_kb
from devkit.reliability.slowclients import classify_raw, legit_requests, open_slow

PIECE = 1024 * 1024
LEGIT = 400  # ordinary requests, 8 at a time, while the slow clients are held
CLIENTS, SIZES = 100, (20_000_000, 100_000_000)  # --bodies: uploads at once, bytes each


class PeakRSS:
    """Peak resident memory of some processes, sampled every 0.2 s in a thread."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:  # at once, then every 0.2 s: a burst shorter than that still has a peak
            self.peak = {n: max(self.peak[n], rss_kb(p)) for n, p in self.pids.items()}
            if self._stop.wait(0.2):
                return

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def mib(self) -> dict[str, float]:
        return {k: round(v / 1024, 1) for k, v in self.peak.items()}


async def upload(port: int, size: int) -> str:
    """One upload of ``size`` bytes; what the gateway answered."""
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\nConnection: close\r\n\r\n").encode()
    start = b'{"model": "' + MODEL.encode() + b'", "prompt": "'
    piece = b"x" * PIECE
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return "reset"
    data = b""
    try:
        writer.write(head + start)
        left = size - len(start) - 2
        while left > 0:
            writer.write(piece[:min(PIECE, left)])
            left -= min(PIECE, left)
            await writer.drain()
        writer.write(b'"}')
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 120)
    except (OSError, TimeoutError):
        # Envoy answered early and closed while the body was still going: read what it sent.
        with contextlib.suppress(OSError, TimeoutError):
            data = await asyncio.wait_for(reader.read(), 5)
    finally:
        with contextlib.suppress(OSError):
            writer.close()
    return classify_raw(data) if data else "reset"


async def burst(port: int, size: int) -> Counter[str]:
    return Counter(await asyncio.gather(*(upload(port, size) for _ in range(CLIENTS))))


def bodies() -> None:
    """``--bodies``: each mode and size, :data:`CLIENTS` uploads at once; a JSON line each."""
    for mode in ("BUFFERED", "FULL_DUPLEX_STREAMED"):
        with sim_gateway(f"bench-overload-{mode}-", 1, mode=mode) as gw:
            pids = service_pids(gw)
            for size in SIZES:
                before = gw.envoy.stats("downstream_rq_")
                with PeakRSS(pids) as peak:
                    answers = asyncio.run(burst(gw.listen, size))
                after = gw.envoy.stats("downstream_rq_")
                # What Envoy answered, also to clients that could not read it (they were
                # still sending when the early answer came and the connection closed).
                sent = {k.rpartition(".")[2]: after[k] - before.get(k, 0) for k in after
                        if k.startswith("http.gateway.downstream_rq_")
                        and k[-3:] in ("2xx", "4xx", "5xx") and after[k] > before.get(k, 0)}
                print(json.dumps({"mode": mode, "size": size, "clients": CLIENTS,
                                  "answers": dict(answers), "envoy_answered": sent,
                                  "rss_peak_mib": peak.mib()}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slow", type=int, default=5000)
    ap.add_argument("--streams", type=int, default=3000)
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds between opening the slow clients and the legitimate "
                         "requests (0: at once, while BBR still takes the slow streams in)")
    ap.add_argument("--bodies", action="store_true", help="large uploads at once instead")
    args = ap.parse_args()
    if args.bodies:
        return bodies()
    result: dict[str, Any] = {"slow_clients": args.slow, "streams": args.streams}
    with sim_gateway("bench-overload-", 4) as gw:
        pids = service_pids(gw)
        base = {k: round(rss_kb(p) / 1024, 1) for k, p in pids.items()}
        with PeakRSS(pids) as peak:
            started = time.monotonic()
            slow = open_slow(gw.listen, args.slow, model=MODEL)
            opened = time.monotonic() - started
            time.sleep(args.settle)
            legit = asyncio.run(legit_requests(gw.url(), LEGIT, 8, model=MODEL))
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
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
