"""What the standalone benchmark tools share: the echo pool, starting helper and ext_proc
processes, the whole gateway in front of a simulator fleet, running contenders in interleaved
rounds with the closed-loop load generator (and their processes' CPU time).

``python -m bench.harness URL BODY_FILE CONCURRENCY SECONDS`` is that load generator: one
:func:`closed_loop` run, its stats as JSON on stdout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devkit.reliability.gateway import Gateway

Results = dict[str, list[dict[str, float]]]
PODS = [f"127.0.20.{i}" for i in range(1, 5)]


def echo_pool(work: Path, token_gap_ms: float = 2.0
              ) -> tuple[Path, int, subprocess.Popen[bytes]]:
    """What the gateway benches share, in ``work``: the 0.9 KB chat body (``body.json``), the
    pool's manifests (``pool.yaml``) and the echo pods (one process answering at once on every
    :data:`PODS` address). Returns the body file, the pods' port and their process."""
    from devkit.envoy import free_port
    from devkit.manifests import pool_manifests, write_yaml

    body = work / "body.json"
    body.write_bytes(json.dumps({
        "model": "m", "max_tokens": 16,
        "messages": [{"role": "user", "content": "Tell me about Envoy. " * 40}]}).encode())
    port = free_port()
    write_yaml(work / "pool.yaml",
               pool_manifests("bench", [(f"pod-{i}", ip) for i, ip in enumerate(PODS)], port))
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
    """Terminate ``procs`` and wait for each."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(10)


def load(url: str, body: Path, concurrency: int, seconds: float) -> dict[str, Any]:
    """One :func:`closed_loop` run against ``url`` in its own process (so the client does not
    share an event loop with what it measures): its stats."""
    out = subprocess.run([sys.executable, "-m", "bench.harness", url, str(body),
                          str(concurrency), str(seconds)],
                         capture_output=True, text=True, check=True)
    stats: dict[str, Any] = json.loads(out.stdout)
    return stats


async def closed_loop(url: str, body: bytes, concurrency: int, seconds: float,
                      warmup: float = 0.5) -> dict[str, Any]:
    """``concurrency`` workers (aiohttp) POST ``body`` back to back for ``warmup`` + ``seconds``:
    ``requests`` answered 200 and ``errors`` after the warm-up, p50_ms and p99_ms of the former,
    and ``total``, every request finished, the warm-up's included (what a server's CPU time
    covers)."""
    import aiohttp

    from devkit.stats import percentile

    latencies: list[float] = []
    errors = total = 0
    headers = {"content-type": "application/json"}
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        measure_from = time.perf_counter() + warmup
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
    return {"requests": len(latencies), "errors": errors, "seconds": seconds, "total": total,
            "p50_ms": statistics.median(latencies) * 1e3 if latencies else 0.0,
            "p99_ms": percentile(latencies, 0.99) * 1e3}


def start_extproc(work: Path, name: str, cmd: list[str], *, metrics: bool = True,
                  cwd: Path | None = None, env_extra: dict[str, str] | None = None
                  ) -> tuple[subprocess.Popen[bytes], tuple[int, int]]:
    """An ext_proc service (``cmd`` without its ports) on fresh gRPC, health and (``metrics``)
    metrics ports, its output in ``work/<name>.log``: its process and (gRPC, health) ports."""
    from devkit.envoy import free_port

    grpc, health = free_port(), free_port()
    ports = ["--grpc-port", str(grpc), "--grpc-health-port", str(health)]
    if metrics:
        ports += ["--metrics-port", str(free_port())]
    return start(cmd + ports, work / f"{name}.log", cwd, env_extra), (grpc, health)


def epp_cmd(work: Path, *flags: str) -> list[str]:
    """An EPP over the echo pool's manifests (:func:`echo_pool`), plaintext."""
    return [sys.executable, "-m", "epp.main", "--secure-serving=false",
            "--manifests", str(work / "pool.yaml"), *flags]


@contextlib.contextmanager
def sim_gateway(prefix: str, pods: int = 4, **kw: Any) -> Iterator[Gateway]:
    """The whole gateway (Envoy → BBR → EPP, ``devkit.reliability.faultkit``) in front of
    ``pods`` simulator pods, in a fresh directory; ``kw`` goes to ``start_sim_gateway``."""
    from devkit.reliability.faultkit import SimFleet, start_sim_gateway

    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    fleet = SimFleet(pods, workdir).start()
    try:
        gw = start_sim_gateway(workdir, fleet, **kw)
        try:
            yield gw
        finally:
            gw.stop()
    finally:
        fleet.stop()


def service_pids(gw: Gateway) -> dict[str, int]:
    """The pids of a :func:`sim_gateway`'s Envoy, BBR and EPP (those running)."""
    procs = {"envoy": gw.envoy.proc, "bbr": gw.bbr.proc, "epp": next(iter(gw.epps.values())).proc}
    return {name: proc.pid for name, proc in procs.items() if proc is not None}


def cpu_load(url: str, body: Path, concurrency: int, seconds: float,
             pids: Sequence[int] = ()) -> dict[str, Any]:
    """:func:`load` with the CPU time (user + system, every thread) each of ``pids`` used
    meanwhile (``cpu``: seconds per pid, in order), the wall time (``wall``) and ``rps``."""
    from bench.cpubudget import cpu_seconds

    before, t0 = [cpu_seconds(p) for p in pids], time.monotonic()
    stats = load(url, body, concurrency, seconds)
    stats["wall"] = time.monotonic() - t0
    stats["cpu"] = [cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
    stats["rps"] = stats["requests"] / stats["seconds"]
    return stats


def interleaved(names: Sequence[str], rounds: int,
                measure: Callable[[int, str], dict[str, Any]]) -> Results:
    """``measure(round, name)`` for every contender, ``rounds`` times, the order reversed
    every other round (so a noisy machine's drift falls on every contender alike)."""
    results: Results = {name: [] for name in names}
    for rnd in range(rounds):
        for name in (names if rnd % 2 == 0 else list(reversed(names))):
            results[name].append(measure(rnd, name))
    return results


if __name__ == "__main__":  # :func:`load`'s client: URL BODY_FILE CONCURRENCY SECONDS -> JSON
    from shared.server import install_uvloop

    install_uvloop()
    print(json.dumps(asyncio.run(closed_loop(sys.argv[1], Path(sys.argv[2]).read_bytes(),
                                             int(sys.argv[3]), float(sys.argv[4])))))
