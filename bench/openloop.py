"""An open-loop, streaming load generator for OpenAI-style endpoints.

Open loop: every request is sent at its scheduled arrival time whether or not earlier ones
have finished (Poisson, constant or bursty schedules come from :mod:`bench.workloads`), so an
overloaded router shows up as growing latency instead of a politely slower client. Each
request streams (SSE) and the client records what a user would see:

- TTFT: send -> first token event;
- ITL: gaps between token events as received (network coalescing merges some);
- e2e, output tokens (from the final ``usage`` event), HTTP status, error text, and the
  ``x-inference-pod`` that served it (to check where a router sent what); :mod:`bench.report`
  derives TPOT from them: (e2e - TTFT) / (output tokens - 1), vLLM's "time per output token".

Run in its own process (the machine has 2 cores; sharing an event loop with what it measures
would bias the numbers)::

    python -m bench.openloop --url URL --requests REQS.jsonl --out RESULTS.jsonl [--progress]

``REQS.jsonl`` holds one :class:`bench.workloads.RequestSpec` per line; the output one
:class:`Outcome` per line, in request order.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

TOKEN_MARKERS = (b'"text":"', b'"content":"')


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it (wall seconds; ``start`` relative to the run)."""

    index: int
    start: float = 0.0
    status: int = 0
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    pod: str = ""
    error: str = ""
    itl: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Completed with 200 and at least one token."""
        return self.status == 200 and not self.error and self.ttft is not None


def _has_token(event: bytes) -> bool:
    # A token event carries non-empty text (completions) or content (chat). The role-only
    # first chat delta and the usage event do not count for TTFT.
    for marker in TOKEN_MARKERS:
        pos = event.find(marker)
        if pos >= 0 and event[pos + len(marker):pos + len(marker) + 1] != b'"':
            return True
    return False


def _read_usage(event: bytes, out: Outcome) -> None:
    try:
        usage = orjson.loads(event).get("usage") or {}
    except orjson.JSONDecodeError:
        return
    out.output_tokens = int(usage.get("completion_tokens") or out.output_tokens)
    out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    out.cached_tokens = int(details.get("cached_tokens") or 0)


async def one_request(session: aiohttp.ClientSession, url: str, spec: dict[str, Any],
                      out: Outcome, t0: float, timeout: float) -> None:
    """Send ``spec`` at its arrival time and stream the answer into ``out``."""
    delay = t0 + float(spec["at"]) - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    sent = time.perf_counter()
    out.start = sent - t0
    events = 0
    last = sent
    try:
        async with asyncio.timeout(timeout):
            async with session.post(url + spec["path"], data=orjson.dumps(spec["body"]),
                                    headers={"content-type": "application/json",
                                             **spec.get("headers", {})}) as resp:
                out.status = resp.status
                out.pod = resp.headers.get("x-inference-pod", "")
                if resp.status != 200:
                    out.error = (await resp.read())[:200].decode(errors="replace")
                    return
                buf = b""
                async for chunk in resp.content.iter_any():
                    now = time.perf_counter()
                    buf += chunk
                    *complete, buf = buf.split(b"\n\n")
                    got_token = False
                    for raw in complete:
                        if not raw.startswith(b"data: "):
                            continue
                        event = raw[6:]
                        if event == b"[DONE]":
                            continue
                        if _has_token(event):
                            events += 1
                            got_token = True
                        elif b'"usage"' in event:
                            _read_usage(event, out)
                    if got_token:
                        if out.ttft is None:
                            out.ttft = now - sent
                        else:
                            out.itl.append(now - last)
                        last = now
        out.e2e = time.perf_counter() - sent
        if not out.output_tokens:
            out.output_tokens = events
        if out.ttft is None:
            out.error = "no token received"
    except TimeoutError:
        out.error = f"timeout after {timeout:g}s"
    except (aiohttp.ClientError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]


async def run(url: str, specs: list[dict[str, Any]], *, timeout: float = 120.0,
              progress: bool = False) -> list[Outcome]:
    """Play the schedule ``specs`` against ``url``; one :class:`Outcome` per spec."""
    outcomes = [Outcome(index=i) for i in range(len(specs))]
    # No connection limit: an open-loop client must never queue requests on its own side.
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=conn, timeout=client_timeout) as session:
        t0 = time.perf_counter() + 0.05
        tasks = [asyncio.create_task(one_request(session, url, s, o, t0, timeout))
                 for s, o in zip(specs, outcomes, strict=True)]
        try:
            if not progress:
                raise ImportError
            import rich  # noqa: F401 - only to know whether a bar can be drawn
        except ImportError:
            await asyncio.gather(*tasks)
        else:
            await _with_progress(tasks, outcomes)
    return outcomes


async def _with_progress(tasks: list[asyncio.Task[None]], outcomes: list[Outcome]) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True, console=Console(file=sys.stderr)) as bar:
        job = bar.add_task("requests", total=len(tasks))
        for fut in asyncio.as_completed(tasks):
            await fut
            errors = sum(1 for o in outcomes if o.error)
            bar.update(job, advance=1, description=f"requests (errors {errors})")


def load_specs(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL schedule written by :func:`bench.workloads.write_specs`."""
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> None:
    """CLI entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--requests", type=Path, required=True, help="JSONL schedule")
    p.add_argument("--out", type=Path, required=True, help="JSONL outcomes")
    p.add_argument("--timeout", type=float, default=120.0, help="per-request limit, seconds")
    p.add_argument("--progress", action="store_true", help="rich progress bar on stderr")
    args = p.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    specs = load_specs(args.requests)
    outcomes = asyncio.run(run(args.url.rstrip("/"), specs, timeout=args.timeout,
                               progress=args.progress))
    args.out.write_bytes(b"".join(orjson.dumps(asdict(o)) + b"\n" for o in outcomes))


if __name__ == "__main__":
    main()
