"""A small closed-loop HTTP load generator (aiohttp + uvloop), run in its own process so it
does not share an event loop with what it measures."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import aiohttp

from devkit.stats import percentile
from shared.server import install_uvloop


@dataclass
class Stats:
    """What one load run measured."""

    requests: int
    errors: int
    seconds: float
    #: Every request finished, the warm-up's included (what a server's CPU time covers).
    total: int
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


async def closed_loop(url: str, body: bytes, concurrency: int, seconds: float,
                      warmup: float = 0.5) -> Stats:
    """``concurrency`` workers POST ``body`` back to back for ``seconds``."""
    latencies: list[float] = []
    errors = total = 0
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=conn) as session:
        start = time.perf_counter()
        measure_from = start + warmup
        stop_at = measure_from + seconds

        async def worker() -> None:
            nonlocal errors, total
            while (now := time.perf_counter()) < stop_at:
                try:
                    async with session.post(url, data=body, headers=headers) as resp:
                        await resp.read()
                        ok = resp.status == 200
                except aiohttp.ClientError:
                    ok = False
                done = time.perf_counter()
                total += 1
                if now >= measure_from:
                    if ok:
                        latencies.append(done - now)
                    else:
                        errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Stats(
        requests=len(latencies), errors=errors, seconds=seconds, total=total,
        p50_ms=statistics.median(latencies) * 1e3 if latencies else 0.0,
        p99_ms=percentile(latencies, 0.99) * 1e3,
    )


def main() -> None:
    """``python -m bench.loadgen URL BODY_FILE CONCURRENCY SECONDS`` → JSON stats on stdout."""
    url, body_file, concurrency, seconds = sys.argv[1:5]
    with open(body_file, "rb") as f:
        body = f.read()
    install_uvloop()
    stats = asyncio.run(closed_loop(url, body, int(concurrency), float(seconds)))
    print(json.dumps(asdict(stats)))


if __name__ == "__main__":
    main()
