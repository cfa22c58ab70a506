"""What the overhead benchmarks share: starting helper processes, running contenders in
interleaved rounds with the closed-loop load generator, and reporting medians."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

Results = dict[str, list[dict[str, float]]]


def overhead_args(doc: str | None) -> argparse.Namespace:
    """The flags every overhead benchmark takes (``--quick``: one short round, for CI)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--quick", action="store_true", help="one short round (CI smoke)")
    args = p.parse_args()
    if args.quick:
        args.seconds, args.rounds = 1.0, 1
    return args


def start(cmd: list[str], log: Path, cwd: Path | None = None,
          env_extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A helper process with its output in ``log``; ``cwd``: run it from another checkout
    (its packages come first on the path); ``env_extra``: variables for it alone."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    if cwd is not None:
        env["PYTHONPATH"] = str(cwd)
    with log.open("w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(10)


def load(url: str, body: Path, concurrency: int, seconds: float) -> dict[str, Any]:
    """One closed-loop run of :mod:`bench.loadgen` (its own process) against ``url``: its
    stats (requests, errors, seconds, total, p50_ms, p99_ms)."""
    out = subprocess.run([sys.executable, "-m", "bench.loadgen", url, str(body),
                          str(concurrency), str(seconds)],
                         capture_output=True, text=True, check=True)
    stats: dict[str, Any] = json.loads(out.stdout)
    return stats


def run_rounds(contenders: dict[str, str], body: Path, concurrency: int, seconds: float,
               rounds: int, pids: dict[str, int] | None = None) -> Results:
    """Each contender URL under the same load, rounds alternating in order (noisy machine).
    ``pids``: contenders whose process CPU time per request is read around each run too
    (``cpu_ms``: user + system, every thread)."""
    from bench.cpubudget import cpu_seconds

    results: Results = {name: [] for name in contenders}
    for rnd in range(rounds):
        order = list(contenders) if rnd % 2 == 0 else list(reversed(contenders))
        for name in order:
            pid = (pids or {}).get(name)
            cpu0 = cpu_seconds(pid) if pid else 0.0
            stats = load(contenders[name], body, concurrency, seconds)
            if pid:
                stats["cpu_ms"] = (cpu_seconds(pid) - cpu0) * 1e3 / max(stats["requests"], 1)
            stats["rps"] = stats["requests"] / stats["seconds"]
            results[name].append(stats)
            print(f"round {rnd + 1} {name:28s} {stats['rps']:8.0f} req/s "
                  f"p50 {stats['p50_ms']:.2f} ms p99 {stats['p99_ms']:.2f} ms "
                  f"errors {stats['errors']}", file=sys.stderr)
    return results


def medians(results: Results) -> dict[str, dict[str, float]]:
    """Per contender: the median over rounds of throughput and latency percentiles."""
    return {name: {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50_ms", "p99_ms")}
            for name, runs in results.items()}


def table(med: dict[str, dict[str, float]]) -> list[str]:
    """A Markdown table of the medians."""
    lines = ["| contender | req/s | p50 ms | p99 ms |", "|---|---:|---:|---:|"]
    for name, m in med.items():
        lines.append(f"| {name} | {m['rps']:.0f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} |")
    return lines


def ratio_row(label: str, ours: dict[str, float], floor: dict[str, float]) -> str:
    """``| label | throughput ratio | p50 ratio | p99 ratio |`` (ours / floor)."""
    return (f"| {label} | {ours['rps'] / floor['rps']:.2f} | "
            f"{ours['p50_ms'] / floor['p50_ms']:.2f} | {ours['p99_ms'] / floor['p99_ms']:.2f} |")


def had_errors(results: Results) -> bool:
    return any(s["errors"] for runs in results.values() for s in runs)
