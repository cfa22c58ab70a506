"""CPU time of one request through the director in process (route + finish, default
config, 3-endpoint pool, ~1 KB prompts from 50 shared prefixes), no Envoy, no network.

    python -m bench.epp_route_bench [--requests 3000] [--rounds 7]

CPU time (``process_time``) rather than wall time, so a busy machine inflates it less; the
best round is reported.
"""

from __future__ import annotations

import argparse
import random
import time

import orjson

from devkit.manifests import pool_manifests
from epp.config import build
from epp.datastore import Datastore, EndpointMetrics
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from epp.requestcontrol import Director


def director() -> Director:
    """The default runtime over a 3-endpoint pool with idle metrics that never go stale."""
    pods = [(f"pod-{i}", f"10.1.0.{i + 1}") for i in range(3)]
    objects = [parse_object(d) for d in pool_manifests("pool", pods, 8000)]
    store = Datastore()
    store.replace(build_snapshot([o for o in objects if o is not None], pool_name="pool",
                                 pool_namespace="default"))
    for view in store.views():
        view.begin_scrape()
        store.record_scrape(view, EndpointMetrics(waiting=0, running=0, kv_usage=0.0,
                                                  updated_at=time.monotonic() + 3600))
    return Director.of(build(datastore=store, rng=random.Random(0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    d = director()
    headers = {":path": "/v1/completions"}
    rounds = []
    for _ in range(args.rounds):
        t0 = time.process_time()
        for i in range(args.requests):
            body = orjson.dumps({"model": "m", "prompt": f"shared system prompt {i % 50} " * 40})
            _, routed = d.route(headers, body, {})
            d.finish(routed, completed=True, status=200, response_size=100, prompt_tokens=10,
                     completion_tokens=5)
        rounds.append((time.process_time() - t0) / args.requests * 1e6)
    print(f"route+finish CPU time: best {min(rounds):.1f} us/request "
          f"(rounds {', '.join(f'{r:.1f}' for r in rounds)})")


if __name__ == "__main__":
    main()
