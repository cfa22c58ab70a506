"""Pick latency of the EPP scheduler (default profile) for 10 / 100 / 1,000 endpoints.

Run: ``python bench/epp_pick_bench.py [--requests N] [--config FILE]``. Each request has a
~2 KB prompt drawn from 50 shared prefixes (so the prefix index matters), and every pick is
followed by ``post_pick`` and an in-flight start, as the director does; only ``schedule``
is timed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from epp.config import build_scheduler, load_config_file, parse_config
from epp.datastore import Endpoint, EndpointMetrics, EndpointView
from epp.scheduling import LLMRequest


def make_views(n: int, rng: random.Random) -> list[EndpointView]:
    """``n`` endpoints with random load."""
    now = time.monotonic()
    views = []
    for i in range(n):
        ep = Endpoint(
            name=f"pod-{i}-rank-0", pod_name=f"pod-{i}", namespace="default",
            address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", port=8000, rank=0,
            labels={"app": "vllm"},
        )
        v = EndpointView(ep)
        v.apply_scrape(EndpointMetrics(
            waiting=rng.randrange(0, 10), running=rng.randrange(0, 64),
            kv_usage=rng.random(), updated_at=now,
        ))
        views.append(v)
    return views


def run(n_endpoints: int, n_requests: int, config_text: str | None,
        clock: str = "wall") -> tuple[float, float]:
    """p50 and p99 of ``schedule`` in microseconds (``clock``: ``wall`` or ``cpu``, the
    process's CPU time, which a machine busy with other work inflates far less)."""
    now = time.perf_counter if clock == "wall" else time.process_time
    rng = random.Random(1)
    views = make_views(n_endpoints, rng)
    scheduler = build_scheduler(parse_config(config_text), rng=random.Random(2))
    prefixes = [(f"system prompt {k} " * 60).encode()[:1500] for k in range(50)]
    samples: list[float] = []
    for i in range(n_requests):
        prompt = rng.choice(prefixes) + f" question {i} ".encode() * 30
        req = LLMRequest(request_id=str(i), target_model="m", client_model="m", prompt=prompt,
                         prompt_tokens=len(prompt) // 4)
        t0 = now()
        result = scheduler.schedule(req, views)
        samples.append(now() - t0)
        scheduler.post_pick(req, result)
        result.endpoints[0].start_request(req.prompt_tokens)
        if i % 4 == 0:  # keep the in-flight counts bounded, as responses would
            rng.choice(views).end_request(0)
    samples.sort()
    p50 = statistics.median(samples) * 1e6
    p99 = samples[int(len(samples) * 0.99) - 1] * 1e6
    return p50, p99


def main() -> None:
    """Print p50/p99 pick latency per pool size."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--config", help="EndpointPickerConfig file (default profile if absent)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time picks by wall clock (default) or by this process's CPU time")
    args = ap.parse_args()
    text = None
    if args.config:
        load_config_file(args.config)  # validate with a clear error first
        with open(args.config) as f:
            text = f.read()
    for n in (10, 100, 1000):
        p50, p99 = run(n, args.requests, text, args.clock)
        print(f"endpoints={n:5d}  p50={p50:8.1f} us  p99={p99:8.1f} us")


if __name__ == "__main__":
    main()
