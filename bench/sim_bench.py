"""Simulator benchmark: is ``vllm-sim`` faithful to its timing model, and cheap enough?

Run: ``python -m bench.sim_bench`` (about 2 minutes) or ``python -m bench.sim_bench --quick``
(under 20 s). The simulator runs as a subprocess (``python -m sim.main``) on its own core; the
load generator runs here. Four measurements:

1. saturation curve of one ``8b-h100`` server: open-loop Poisson arrivals at a ladder of rates,
   streaming completions, throughput and client-side TTFT p50/p90 (reported in *model* seconds,
   i.e. divided by the time scale, so the numbers read like a real H100);
2. prefix-cache effect: TTFT of prompts sharing a long system prompt vs unique prompts;
3. CPU seconds the simulator process spends per simulated request;
4. keep-up check: 8 servers x 32 concurrent streams at time scale 1; the token rate achieved
   over HTTP divided by the rate the engine model predicts for the same closed-loop workload
   (computed on a virtual clock). 1.0 means the simulator is not the bottleneck.

Results go to stdout, ``bench/plots/sim_*.png`` and the "## Simulator" section of
``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from sim.engine import Engine, SimRequest
from sim.profiles import H100_8B

ROOT = Path(__file__).resolve().parent
PLOTS = ROOT / "plots"
RESULTS = ROOT / "RESULTS.md"
PROMPT_TOKENS = 1000
OUTPUT_TOKENS = 100


# -- simulator subprocess -----------------------------------------------------------------------
class SimProcess:
    """``python -m sim.main`` in a subprocess; reads its ready line and its CPU time."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sim.main", "--log-level", "warning", *args],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("vllm-sim ready:"):
            self.proc.kill()
            raise RuntimeError(f"simulator did not start: {line!r}")
        self.urls = line.split()[2:]

    def cpu_seconds(self) -> float:
        """User + system CPU seconds used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """SIGTERM and wait."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- client -------------------------------------------------------------------------------------
@dataclass
class Result:
    """One streamed request as the client saw it (seconds of wall time)."""

    ttft: float
    e2e: float
    tokens: int
    ok: bool


async def stream_once(session: aiohttp.ClientSession, url: str, prompt: str,
                      max_tokens: int) -> Result:
    """POST a streaming completion and count ``data:`` events (no JSON parsing: cheap)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    ttft = 0.0
    events = 0
    try:
        async with session.post(url + "/v1/completions", json={
                "prompt": prompt, "max_tokens": max_tokens, "stream": True}) as resp:
            if resp.status != 200:
                await resp.read()
                return Result(0.0, loop.time() - t0, 0, False)
            async for chunk in resp.content.iter_any():
                if not events:
                    ttft = loop.time() - t0
                events += chunk.count(b"data: ")
    except aiohttp.ClientError:
        return Result(0.0, loop.time() - t0, 0, False)
    return Result(ttft, loop.time() - t0, max(0, events - 1), True)  # minus [DONE]


def pct(values: list[float], q: float) -> float:
    """Nearest-rank quantile; NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def make_prompt(rng: random.Random, tokens: int, prefix: str = "") -> str:
    """A prompt of ``tokens`` tokens (4 bytes each) starting with ``prefix``, unique tail."""
    body = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(tokens * 4))
    return (prefix + body)[: tokens * 4]


# -- 1. saturation curve ------------------------------------------------------------------------
@dataclass
class Point:
    """One offered-load level."""

    offered: float  # model req/s
    achieved: float  # model req/s
    tok_s: float  # model output tokens/s
    ttft_p50: float  # model seconds
    ttft_p90: float
    errors: int


async def open_loop(url: str, rate: float, seconds: float, scale: float,
                    rng: random.Random) -> tuple[list[Result], float]:
    """Poisson arrivals at ``rate`` model req/s for ``seconds`` of wall time."""
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=300)) as session:
        tasks = []
        start = loop.time()
        t = start
        while True:
            t += rng.expovariate(rate / scale)
            if t - start > seconds:
                break
            delay = t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = make_prompt(rng, PROMPT_TOKENS)
            tasks.append(asyncio.create_task(stream_once(session, url, prompt, OUTPUT_TOKENS)))
        results = await asyncio.gather(*tasks)
        return list(results), loop.time() - start


async def saturation(rates: list[float], seconds: float, scale: float) -> tuple[
        list[Point], float, int]:
    sim = SimProcess("--port", "0", "--profile", "8b-h100", "--time-scale", str(scale))
    rng = random.Random(1)
    points = []
    cpu0 = sim.cpu_seconds()
    n_req = 0
    try:
        for rate in rates:
            results, wall = await open_loop(sim.urls[0], rate, seconds, scale, rng)
            ok = [r for r in results if r.ok]
            n_req += len(ok)
            ttfts = [r.ttft / scale for r in ok]
            points.append(Point(
                offered=rate, achieved=len(ok) / (wall / scale),
                tok_s=sum(r.tokens for r in ok) / (wall / scale),
                ttft_p50=pct(ttfts, 0.5), ttft_p90=pct(ttfts, 0.9),
                errors=len(results) - len(ok)))
        cpu = sim.cpu_seconds() - cpu0
    finally:
        sim.stop()
    return points, cpu, n_req


# -- 2. prefix effect ---------------------------------------------------------------------------
async def prefix_effect(n: int, scale: float) -> tuple[float, float, float, float]:
    """TTFT p50 / p90 (model s) of n sequential requests: shared 4000-token prefix vs none."""
    sim = SimProcess("--port", "0", "--profile", "8b-h100", "--time-scale", str(scale))
    rng = random.Random(2)
    system = make_prompt(rng, 4000)
    out = []
    try:
        async with aiohttp.ClientSession() as session:
            for shared in (True, False):
                ttfts = []
                for _ in range(n):
                    tail = make_prompt(rng, 200)
                    prompt = system + tail if shared else make_prompt(rng, 4000) + tail
                    r = await stream_once(session, sim.urls[0], prompt, 4)
                    ttfts.append(r.ttft / scale)
                ttfts = ttfts[1:] if shared else ttfts  # the first shared one fills the cache
                out += [pct(ttfts, 0.5), pct(ttfts, 0.9)]
    finally:
        sim.stop()
    return out[0], out[1], out[2], out[3]


# -- 4. keep-up check ---------------------------------------------------------------------------
def expected_tokens(streams: int, lengths: tuple[int, int], prompt_tokens: int,
                    seconds: float) -> float:
    """Token rate the engine model gives a closed loop of ``streams`` on a virtual clock."""
    engine = Engine(H100_8B)
    rng = random.Random(4)
    prompt = b"p" * (prompt_tokens * 4)
    now = 0.0
    produced = 0

    def new() -> SimRequest:
        r = engine.new_request(prompt, rng.randint(*lengths), now=now)
        r.block_hashes = []  # unique prompts: no cache hits, like the HTTP run
        return r

    for _ in range(streams):
        engine.add(new())
    while now < seconds:
        end = engine.begin_step(now)
        batch = engine.num_running
        engine.finish_step()
        done = streams - engine.num_running - engine.num_waiting
        now = end
        produced += batch
        for _ in range(done):
            engine.add(new())
    return produced / now


async def keep_up(servers: int, streams: int, seconds: float) -> tuple[float, float, float,
                                                                        float]:
    """Achieved/expected token rate for servers x streams closed-loop at time scale 1."""
    sim = SimProcess(*[a for _ in range(servers) for a in ("--port", "0")],
                     "--profile", "8b-h100")
    lengths, prompt_tokens = (20, 100), 100  # random lengths keep streams out of phase
    rng = random.Random(3)
    tokens = 0
    start_at = stop_at = 0.0
    warmup = 1.5  # skip the start-up transient (256 connections, first prefills)

    async def worker(session: aiohttp.ClientSession, url: str) -> None:
        # Count tokens as they arrive, only inside the measurement window.
        nonlocal tokens
        loop = asyncio.get_running_loop()
        await asyncio.sleep(rng.uniform(0, warmup / 2))
        while loop.time() < stop_at:
            payload = {"prompt": make_prompt(rng, prompt_tokens),
                       "max_tokens": rng.randint(*lengths), "stream": True}
            async with session.post(url + "/v1/completions", json=payload) as resp:
                async for chunk in resp.content.iter_any():
                    now = loop.time()
                    if now > stop_at:
                        break
                    if now >= start_at:
                        tokens += chunk.count(b"data: ") - chunk.count(b"data: [DONE]")

    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            loop = asyncio.get_running_loop()
            t0 = loop.time() + warmup
            start_at, stop_at = t0, t0 + seconds
            workers = asyncio.gather(*(worker(session, url) for url in sim.urls
                                       for _ in range(streams)))
            await asyncio.sleep(warmup)
            cpu0 = sim.cpu_seconds()
            await asyncio.sleep(seconds)
            cpu = sim.cpu_seconds() - cpu0
            await workers
            wall = seconds
    finally:
        sim.stop()
    achieved = tokens / wall
    expected = servers * expected_tokens(streams, lengths, prompt_tokens, 120.0)
    return achieved, expected, achieved / expected, cpu / seconds


# -- report -------------------------------------------------------------------------------------
def plot(points: list[Point], prefix: tuple[float, float, float, float]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    PLOTS.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    x = [p.offered for p in points]
    ax1.plot(x, [p.tok_s for p in points], "o-")
    ax1.set_xlabel("offered load (req/s)")
    ax1.set_ylabel("output tokens/s")
    ax1.set_title(f"8b-h100 throughput ({PROMPT_TOKENS} in / {OUTPUT_TOKENS} out)")
    ax2.plot(x, [p.ttft_p50 for p in points], "o-", label="TTFT p50")
    ax2.plot(x, [p.ttft_p90 for p in points], "s--", label="TTFT p90")
    ax2.set_yscale("log")
    ax2.set_xlabel("offered load (req/s)")
    ax2.set_ylabel("seconds (model time)")
    ax2.legend()
    ax2.set_title("time to first token")
    fig.tight_layout()
    sat = PLOTS / "sim_saturation.png"
    fig.savefig(sat, dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.bar(["shared prefix\np50", "shared prefix\np90", "unique\np50", "unique\np90"],
           list(prefix), color=["tab:green", "tab:green", "tab:red", "tab:red"])
    ax.set_ylabel("TTFT seconds (model time)")
    ax.set_title("prefix cache: 4000-token shared prompt")
    fig.tight_layout()
    pre = PLOTS / "sim_prefix.png"
    fig.savefig(pre, dpi=100)
    plt.close(fig)
    return [sat, pre]


def write_results(section: str) -> None:
    """Replace (or append) the '## Simulator' section of bench/RESULTS.md, nothing else."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    start = text.find("\n## Simulator\n")
    if start == -1:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + 1)
        text = text[: start + 1] + section + ("" if end == -1 else text[end:])
    RESULTS.write_text(text)


async def run(quick: bool) -> None:
    scale = 0.1
    rates = [1.0, 2.0, 3.0, 4.0] if quick else [0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 5]
    seconds = 1.5 if quick else 6.0
    t_start = time.monotonic()
    points, cpu, n_req = await saturation(rates, seconds, scale)
    prefix = await prefix_effect(6 if quick else 20, scale)
    achieved, expected, ratio, cpu_util = await keep_up(8, 32, 3.0 if quick else 15.0)
    took = time.monotonic() - t_start

    lines = ["| offered req/s | achieved req/s | output tok/s | TTFT p50 s | TTFT p90 s | errors |",
             "|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        lines.append(f"| {p.offered:g} | {p.achieved:.2f} | {p.tok_s:.0f} | {p.ttft_p50:.3f} | "
                     f"{p.ttft_p90:.3f} | {p.errors} |")
    table = "\n".join(lines)
    cmd = "python -m bench.sim_bench" + (" --quick" if quick else "")
    report = f"""## Simulator

Command: `{cmd}` (took {took:.0f} s; {os.cpu_count()} CPUs; simulator in its own process,
load generator in the benchmark process). Times are *model* seconds (wall / time scale; the
curve runs at `--time-scale {scale}`), so they read like the real `8b-h100` profile.

**Saturation curve**, one `8b-h100` server, open-loop Poisson, streaming completions of
{PROMPT_TOKENS} prompt / {OUTPUT_TOKENS} output tokens (unique prompts):

{table}

Achieved rates are completed requests (tokens) over the time from the first arrival to the
last completion, so past saturation they include draining the queue; the model also loses
throughput there because every admission step prefills a large batch while decodes stall
(no chunked prefill), which is why the curve bends down after its ~3 req/s knee.

![saturation](plots/sim_saturation.png)

**Prefix cache**: TTFT of a 4,200-token prompt whose first 4,000 tokens are shared with the
previous request: p50 {prefix[0]:.3f} s / p90 {prefix[1]:.3f} s; unique prompts of the same
length: p50 {prefix[2]:.3f} s / p90 {prefix[3]:.3f} s
(model: 0.030 + uncached x 0.00025 s, i.e. 0.08 s vs 1.08 s).

![prefix](plots/sim_prefix.png)

**Cost**: {cpu / max(1, n_req) * 1000:.2f} ms of simulator CPU per simulated request
({OUTPUT_TOKENS} streamed tokens each; {n_req} requests in the saturation run).

**Keep-up**, 8 servers x 32 concurrent streams (closed loop, 100 prompt / 20-100 output tokens),
`--time-scale 1`, one simulator process: achieved {achieved:.0f} tok/s vs {expected:.0f} tok/s
predicted by the engine model on a virtual clock -> ratio **{ratio:.3f}**; simulator process
CPU utilisation {cpu_util * 100:.0f}% of one core.
"""
    print(report)
    plot(points, prefix)
    write_results(report)


def main() -> None:
    """Entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short run (< 20 s)")
    args = p.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(run(args.quick))
    else:
        uvloop.run(run(args.quick))


if __name__ == "__main__":
    main()
