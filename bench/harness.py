"""What the overhead benchmarks share: the echo pool, starting helper processes, running
contenders in interleaved rounds with the closed-loop load generator, and reporting medians."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

Results = dict[str, list[dict[str, float]]]
PODS = [f"127.0.20.{i}" for i in range(1, 5)]


def echo_pool(work: Path, token_gap_ms: float = 2.0
              ) -> tuple[Path, int, subprocess.Popen[bytes]]:
    """What the gateway benches share, in ``work``: the 0.9 KB chat body (``body.json``), the
    pool's manifests (``pool.yaml``) and the echo pods (one process answering at once on every
    :data:`PODS` address). Returns the body file, the pods' port and their process."""
    from devkit.envoy import free_port

    body = work / "body.json"
    body.write_bytes(json.dumps({
        "model": "m", "max_tokens": 16,
        "messages": [{"role": "user", "content": "Tell me about Envoy. " * 40}]}).encode())
    port = free_port()
    (work / "pool.yaml").write_text(yaml.safe_dump_all([{
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "bench"},
        "spec": {"selector": {"matchLabels": {"app": "bench"}}, "targetPorts": [{"number": port}],
                 "endpointPickerRef": {"name": "bench-epp", "port": {"number": 9002}}}}, *(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-{i}", "labels": {
            "app": "bench"}}, "status": {"podIP": ip}} for i, ip in enumerate(PODS))]))
    backend = start([sys.executable, "-m", "bench.echo_backend", "--port", str(port),
                     "--token-gap-ms", str(token_gap_ms),
                     *(a for ip in PODS for a in ("--host", ip))], work / "backend.log")
    return body, port, backend


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
