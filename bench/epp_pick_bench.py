"""Pick latency of the EPP scheduler (default profile) for 10 / 100 / 1,000 endpoints.

Run: ``python -m bench.epp_pick_bench [--requests N] [--config FILE]``. Each request has a
~2 KB prompt drawn from 50 shared prefixes (so the prefix index matters), and every pick is
followed by ``post_pick`` and an in-flight start, as the director does; only ``schedule``
is timed.

``--route [--rounds 7]``: the CPU time of one request through the director in process
instead (route + finish, default config, 3-endpoint pool, ~1 KB prompts from 50 shared
prefixes; no Envoy, no network), the best of the rounds (``process_time``, which a busy
machine inflates less than wall time).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import orjson

from devkit.manifests import pool_manifests
from epp.config import build, build_scheduler, load_config_file, parse_config
from epp.datastore import Datastore, Endpoint, EndpointMetrics, EndpointView
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.requestcontrol import Director
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


def director(n: int = 3, config: str | None = None,
             rng: random.Random | None = None) -> Director:
    """The runtime of ``config`` (default profile if None) over an ``n``-endpoint pool whose
    metrics never go stale: idle, or random load drawn from ``rng`` when one is given."""
    pods = [(f"pod-{i}", f"10.8.{i // 256}.{i % 256}") for i in range(n)]
    objects = [parse_object(d) for d in pool_manifests("pool", pods, 8000)]
    store = Datastore()
    store.replace(build_snapshot([o for o in objects if o is not None], pool_name="pool",
                                 pool_namespace="default"))
    for view in store.views():
        view.begin_scrape()
        load = ((rng.randrange(0, 5), rng.randrange(0, 64), rng.random()) if rng
                else (0, 0, 0.0))
        store.record_scrape(view, EndpointMetrics(waiting=load[0], running=load[1],
                                                  kv_usage=load[2],
                                                  updated_at=time.monotonic() + 3600))
    return Director.of(build(parse_config(config), store, rng=rng or random.Random(0)))


def route_rounds(requests: int, rounds: int) -> list[float]:
    """CPU microseconds per request (route + finish) of each round."""
    d = director()
    headers = {":path": "/v1/completions"}
    out = []
    for _ in range(rounds):
        t0 = time.process_time()
        for i in range(requests):
            body = orjson.dumps({"model": "m", "prompt": f"shared system prompt {i % 50} " * 40})
            _, routed = d.route(headers, body, {})
            d.finish(routed, completed=True, status=200, response_size=100, prompt_tokens=10,
                     completion_tokens=5)
        out.append((time.process_time() - t0) / requests * 1e6)
    return out


def main() -> None:
    """Print p50/p99 pick latency per pool size (``--route``: the director's CPU time)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=None,
                    help="requests per pool size (5000), with --route per round (3000)")
    ap.add_argument("--route", action="store_true",
                    help="time route + finish through the director instead of picks")
    ap.add_argument("--rounds", type=int, default=7, help="with --route")
    ap.add_argument("--config", help="EndpointPickerConfig file (default profile if absent)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time picks by wall clock (default) or by this process's CPU time")
    args = ap.parse_args()
    if args.route:
        rounds = route_rounds(args.requests or 3000, args.rounds)
        print(f"route+finish CPU time: best {min(rounds):.1f} us/request "
              f"(rounds {', '.join(f'{r:.1f}' for r in rounds)})")
        return
    text = None
    if args.config:
        load_config_file(args.config)  # validate with a clear error first
        with open(args.config) as f:
            text = f.read()
    for n in (10, 100, 1000):
        p50, p99 = run(n, args.requests or 5000, text, args.clock)
        print(f"endpoints={n:5d}  p50={p50:8.1f} us  p99={p99:8.1f} us")


if __name__ == "__main__":
    main()
