"""Prefill/decode on the simulator: what one request pays, and what decoding gains.

Run: ``python -m bench.pd_sim`` (about 30 s). Everything runs in this process on loopback:
two ``8b-h100`` simulated servers with ``--kv-transfer-config`` (a prefiller and a decoder)
and the real ``pd-sidecar`` proxy in front of the decoder. Time scale 1 (model = wall time).

1. One request, idle servers (8,192-token prompt, 64 tokens out): TTFT and TPOT decoded
   locally (aggregated) vs prefilled remotely over the ``rdma`` and the ``tcp`` link.
2. Interference: a streaming request decodes 400 tokens on the decode server while four
   8,192-token prompts arrive; the gaps between its tokens (ITL), aggregated (the long
   prompts prefill on the same server) vs disaggregated (they prefill on the prefiller).

Timing of the simulator is its model (sim/README.md): these numbers show the model and the
protocol's overheads, not a GPU's.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import aiohttp
from aiohttp import web

from shared.pd import PREFILLER_HEADER
from sidecar.allowlist import AllowAny
from sidecar.proxy import Sidecar, SidecarConfig
from sim.config import ServerConfig
from sim.fleet import Fleet, start_fleet
from sim.pd import LINKS, KVTransferConfig
from sim.profiles import H100_8B

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LONG = 8192


def prompt(i: int, tokens: int = LONG) -> str:
    """A prompt of ``tokens`` tokens (4 bytes each) that shares nothing with prompt ``j != i``."""
    return f"{i:04d}" + "abcd" * (tokens - 1)


@asynccontextmanager
async def pd_stack(link: str) -> AsyncIterator[tuple[Fleet, str]]:
    """Decoder (0) and prefiller (1), and a sidecar in front of the decoder."""
    bandwidth, latency = LINKS[link]
    kv = KVTransferConfig(kv_role="kv_both", bandwidth=bandwidth, latency=latency)
    profile = replace(H100_8B, max_model_len=32768)
    cfgs = [ServerConfig(port=0, profile=profile, kv_transfer=kv, name=n)
            for n in ("decode", "prefill")]
    async with start_fleet(cfgs) as fleet:
        sidecar = Sidecar(SidecarConfig(decoder_url=fleet.urls[0]), AllowAny())
        runner = web.AppRunner(sidecar.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield fleet, f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


async def stream(session: aiohttp.ClientSession, url: str, text: str, max_tokens: int,
                 prefiller: str | None) -> list[float]:
    """Arrival times of each token event of a streaming completion."""
    headers = {PREFILLER_HEADER: prefiller} if prefiller else {}
    times: list[float] = []
    async with session.post(f"{url}/v1/completions", headers=headers, json={
            "model": MODEL, "prompt": text, "max_tokens": max_tokens, "stream": True}) as r:
        assert r.status == 200, await r.text()
        buf = b""
        async for chunk in r.content.iter_any():
            now = time.perf_counter()
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if event.startswith(b"data: {"):
                    times.append(now)
    return times


async def single(link: str) -> dict[str, float]:
    async with pd_stack(link) as (fleet, url), aiohttp.ClientSession() as s:
        prefiller = f"127.0.0.1:{fleet.ports[1]}"
        out: dict[str, float] = {}
        for label, target, i in (("aggregated", None, 1), ("disaggregated", prefiller, 2)):
            start = time.perf_counter()
            t = await stream(s, url, prompt(i), 64, target)
            out[f"{label}_ttft"] = t[0] - start
            out[f"{label}_tpot"] = (t[-1] - t[0]) / (len(t) - 1)
        return out


async def interference(disaggregated: bool) -> list[float]:
    """ITL gaps of a 400-token stream while four long prompts arrive."""
    async with pd_stack("rdma") as (fleet, url), aiohttp.ClientSession() as s:
        prefiller = f"127.0.0.1:{fleet.ports[1]}" if disaggregated else None
        victim = asyncio.create_task(stream(s, url, prompt(0, 16), 400, None))
        await asyncio.sleep(0.3)
        others = []
        for i in range(4):
            others.append(asyncio.create_task(stream(s, url, prompt(10 + i), 16, prefiller)))
            await asyncio.sleep(0.6)
        times = await victim
        await asyncio.gather(*others)
        return [b - a for a, b in itertools.pairwise(times)]


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1]


async def main() -> None:
    print("1. one request, 8,192-token prompt, 64 tokens out, idle servers (8b-h100)")
    for link in ("rdma", "tcp"):
        r = await single(link)
        print(f"   {link:4s}  TTFT aggregated {r['aggregated_ttft'] * 1000:7.1f} ms, "
              f"disaggregated {r['disaggregated_ttft'] * 1000:7.1f} ms "
              f"(+{(r['disaggregated_ttft'] - r['aggregated_ttft']) * 1000:.1f} ms); "
              f"TPOT {r['aggregated_tpot'] * 1000:.1f} / {r['disaggregated_tpot'] * 1000:.1f} ms")
    print("2. a 400-token stream on the decode server while four 8,192-token prompts arrive")
    for dis in (False, True):
        gaps = await interference(dis)
        print(f"   {'disaggregated' if dis else 'aggregated   '}  ITL p50 "
              f"{pct(gaps, 50) * 1000:6.1f} ms, p90 {pct(gaps, 90) * 1000:6.1f} ms, "
              f"max {max(gaps) * 1000:7.1f} ms, tokens {len(gaps) + 1}")


if __name__ == "__main__":
    asyncio.run(main())
