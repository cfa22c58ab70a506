"""Large uploads at once through the real gateway (issue 31, items 6 and 7).

``python -m bench.large_bodies [--clients 100] [--sizes 20000000,100000000]``: for each body
mode (BUFFERED, FULL_DUPLEX_STREAMED) and size, Envoy + BBR + EPP (TLS, default caps: 10 MiB
body, 256 MiB of bodies held per service) in front of a ``vllm-sim`` pod; ``--clients``
uploads start at once, each writing its body in 1 MiB pieces. Prints JSON: answers by status
as the client read them (``<status> json`` = OpenAI-shaped, ``bare`` otherwise, ``reset`` =
the connection closed before the client could read an answer: Envoy answers early and closes
while a large body is still being sent), what Envoy counted as answered (2xx/4xx/5xx) and
the peak RSS of BBR, the EPP and Envoy. Not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench.overload import PeakRSS
from devkit.reliability.faultkit import MODEL, SimFleet, start_sim_gateway
from devkit.reliability.slowclients import classify_raw

PIECE = 1024 * 1024


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


async def burst(port: int, clients: int, size: int) -> Counter[str]:
    return Counter(await asyncio.gather(*(upload(port, size) for _ in range(clients))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--sizes", default="20000000,100000000")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    out: list[dict[str, Any]] = []
    for mode in ("BUFFERED", "FULL_DUPLEX_STREAMED"):
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-bodies-{mode}-"))
        fleet = SimFleet(1, workdir).start()
        gw = start_sim_gateway(workdir, fleet, mode=mode)
        try:
            pids = {"bbr": gw.bbr.proc.pid, "epp": gw.epps["sim"].proc.pid,  # type: ignore[union-attr]
                    "envoy": gw.envoy.proc.pid}  # type: ignore[union-attr]
            for size in sizes:
                before = gw.envoy.stats("downstream_rq_")
                with PeakRSS(pids) as peak:
                    answers = asyncio.run(burst(gw.listen, args.clients, size))
                after = gw.envoy.stats("downstream_rq_")
                # What Envoy answered, also to clients that could not read it (they were
                # still sending when the early answer came and the connection closed).
                sent = {k.rpartition(".")[2]: after[k] - before.get(k, 0) for k in after
                        if k.startswith("http.gateway.downstream_rq_")
                        and k[-3:] in ("2xx", "4xx", "5xx") and after[k] > before.get(k, 0)}
                out.append({"mode": mode, "size": size, "clients": args.clients,
                            "answers": dict(answers), "envoy_answered": sent,
                            "rss_peak_mib": peak.mib()})
                print(json.dumps(out[-1]), flush=True)
        finally:
            gw.stop()
            if fleet.proc is not None:
                fleet.proc.terminate()


if __name__ == "__main__":
    main()
