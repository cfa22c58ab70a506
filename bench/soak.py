"""Soak: the whole gateway (Envoy → BBR → EPP → ``vllm-sim``, 4 pods) at a steady request
rate for a long time, watching the services' RSS, file descriptors and threads and the error
rate per window.

    python -m bench.soak --minutes 30 --rate 40      # the long run (not in CI)
    python -m bench.soak --minutes 1          # what tests/system/reliability/test_soak.py runs
    python -m bench.soak --minutes 30 --graceful-close   # Envoy with graceful ext_proc close

Pass: RSS growth after warm-up ≤ 5%, no fd or thread growth, no error drift.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx
import orjson

from bench.harness import sim_gateway
from devkit.envoy import GRACEFUL_CLOSE
from devkit.reliability.faultkit import MODEL
from devkit.reliability.gateway import Gateway, open_fds, rss_kb, threads


@dataclass
class Sample:
    """Resource use of one service at one moment."""

    t: float
    rss_kb: int
    fds: int
    threads: int


@dataclass
class SoakReport:
    """What a soak measured; :meth:`problems` lists what failed the pass criteria."""

    seconds: float
    rate: float
    requests: int
    errors: int
    window_errors: list[int]
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def growth(self, service: str) -> dict[str, float]:
        """RSS growth (fraction) and fd/thread change from the end of warm-up (25%) to the end."""
        s = self.samples[service]
        base = s[len(s) // 4]
        end = s[-1]
        return {"rss": (end.rss_kb - base.rss_kb) / base.rss_kb, "fds": end.fds - base.fds,
                "threads": end.threads - base.threads, "rss_start_kb": base.rss_kb,
                "rss_end_kb": end.rss_kb}

    def bytes_per_request(self, service: str) -> float:
        """RSS growth per request after warm-up (25%): the least-squares slope of RSS over
        time divided by the request rate. A short run's percentage cannot see a per-request
        leak (1,240 requests x 130 B is 0.16% of BBR), its slope can."""
        s = self.samples[service][len(self.samples[service]) // 4:]
        if len(s) < 3 or not self.requests:
            return 0.0
        slope = statistics.linear_regression([x.t for x in s], [x.rss_kb for x in s]).slope
        return slope * 1024 * self.seconds / self.requests  # KiB/s over requests/s

    def problems(self, *, max_rss_growth: float = 0.05,
                 max_bytes_per_request: float | None = None) -> list[str]:
        out = []
        for service in self.samples:
            g = self.growth(service)
            if g["rss"] > max_rss_growth:
                out.append(f"{service}: RSS grew {g['rss']:.1%}")
            per = self.bytes_per_request(service)
            if max_bytes_per_request is not None and per > max_bytes_per_request:
                out.append(f"{service}: RSS grows {per:.0f} B per request")
            if g["fds"] > 2:
                out.append(f"{service}: {g['fds']:+.0f} file descriptors")
            if g["threads"] > 1:
                out.append(f"{service}: {g['threads']:+.0f} threads")
        third = max(1, len(self.window_errors) // 3)
        if sum(self.window_errors[-third:]) > sum(self.window_errors[:third]) + 2:
            out.append(f"errors drift: {self.window_errors}")
        return out


def run_soak(gw: Gateway, seconds: float, rate: float, *, workers: int = 8,
             window: float = 10.0, sample_every: float = 2.0) -> SoakReport:
    """Send ``rate`` requests/s (paced per worker) for ``seconds``; sample every service."""
    procs = {"bbr": gw.bbr, **{f"epp-{k}": v for k, v in gw.epps.items()}}
    pids = {name: p.proc.pid for name, p in procs.items() if p.proc is not None}
    samples: dict[str, list[Sample]] = {name: [] for name in pids}
    n_windows = max(1, int(seconds / window + 0.999))
    window_errors = [0] * n_windows
    counts = {"requests": 0, "errors": 0}
    lock = threading.Lock()
    start = time.monotonic()
    stop_at = start + seconds

    def worker(offset: float) -> None:
        period = workers / rate
        next_at = start + offset
        with httpx.Client(timeout=10) as client:
            while (now := time.monotonic()) < stop_at:
                if now < next_at:
                    time.sleep(next_at - now)
                next_at += period
                body = orjson.dumps({"model": MODEL, "max_tokens": 8,
                                     "prompt": f"{uuid.uuid4()} soak prompt " * 4})
                try:
                    ok = client.post(gw.url(), content=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                with lock:
                    counts["requests"] += 1
                    if not ok:
                        counts["errors"] += 1
                        idx = min(n_windows - 1, int((time.monotonic() - start) / window))
                        window_errors[idx] += 1

    threads_ = [threading.Thread(target=worker, args=(i * workers / rate / workers,),
                                 daemon=True) for i in range(workers)]
    for t in threads_:
        t.start()
    while time.monotonic() < stop_at:
        now = time.monotonic() - start
        for name, pid in pids.items():
            samples[name].append(Sample(now, rss_kb(pid), open_fds(pid), threads(pid)))
        time.sleep(sample_every)
    for t in threads_:
        t.join(15)
    for name, pid in pids.items():
        samples[name].append(Sample(time.monotonic() - start, rss_kb(pid), open_fds(pid),
                                    threads(pid)))
    return SoakReport(seconds, rate, counts["requests"], counts["errors"], window_errors,
                      samples)


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench.soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=40.0, help="requests per second")
    ap.add_argument("--graceful-close", action="store_true",
                    help="Envoy with ext_proc_graceful_grpc_close on (default: Envoy's defaults)")
    args = ap.parse_args()
    with sim_gateway("soak-", runtime=GRACEFUL_CLOSE if args.graceful_close else None) as gw:
        report = run_soak(gw, args.minutes * 60, args.rate, window=max(10.0, args.minutes * 6))
    summary = {"seconds": report.seconds, "rate": report.rate, "requests": report.requests,
               "errors": report.errors, "window_errors": report.window_errors,
               "growth": {s: report.growth(s) for s in report.samples},
               "problems": report.problems()}
    print(json.dumps(summary, indent=2))
    raise SystemExit(1 if summary["problems"] else 0)


if __name__ == "__main__":
    main()
