"""Pick latency with upstream's predicted-latency profile at 100 endpoints, with the model
idle and while it retrains back to back in its background thread.

Run: ``python -m bench.slo_pick_bench [--requests N]``. Times the director's whole request
path in process (parse, SLO headers, predictions for every candidate, filters, scorer,
picker, pre-request), ``time.perf_counter`` per request; the trainer refits on 5,000 samples
every 100 ms (10x the default schedule) in the second phase, back to back when a fit takes
longer, the fit itself in the plugin's worker process (copying the samples out still runs
in this process); that phase lasts until ``--fits`` fits have run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

import orjson

from bench import epp_pick_bench
from bench.slo_twin import LATENCY
from epp.latency.predictor import EndpointState
from epp.requestcontrol import Director
from epp.requestcontrol.plugins.predicted_latency_producer import PredictedLatencyProducer


def director(n: int, rng: random.Random, config: str | None = LATENCY,
             ) -> tuple[Director, PredictedLatencyProducer | None]:
    d = epp_pick_bench.director(n, config, rng)
    runtime = d.runtime
    if config is None:
        return d, None
    (producer,) = runtime.handle.find(PredictedLatencyProducer)
    producer.predictor.stop()  # this bench schedules the fits itself (every 100 ms)
    for _ in range(5000):
        s = EndpointState(rng.uniform(10, 4000), rng.uniform(0, 4000), rng.randrange(5),
                          rng.randrange(64), rng.random(), rng.uniform(0, 1e5),
                          rng.uniform(0, 1e4))
        producer.predictor.observe(s, 0.05 + s.uncached_tokens * 2.5e-4, 0.012 + s.running * 1e-4)
    producer.predictor.retrain()
    return d, producer


def measure(d: Director, n: int, rng: random.Random) -> list[float]:
    out = []
    for i in range(n):
        body = orjson.dumps({"model": "m", "prompt": f"{i % 50} " * 400})
        headers = {":path": "/v1/completions", "x-request-id": f"r{i}",
                   "x-slo-ttft-ms": str(rng.choice((200, 500, 2000)))}
        t0 = time.perf_counter()
        _, routed = d.route(headers, body, {})
        out.append(time.perf_counter() - t0)
        d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
                 completion_tokens=1)
    return out


def pcts(xs: list[float]) -> str:
    xs = sorted(xs)
    return (f"p50 {statistics.median(xs) * 1e6:.0f} us, "
            f"p99 {xs[int(0.99 * len(xs))] * 1e6:.0f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--endpoints", type=int, default=100)
    ap.add_argument("--fits", type=int, default=10,
                    help="keep picking while retraining until this many fits have run")
    args = ap.parse_args()
    rng = random.Random(0)
    base, _ = director(args.endpoints, rng, None)
    measure(base, 300, rng)
    default = measure(base, args.requests, rng)
    d, producer = director(args.endpoints, rng)
    assert producer is not None
    measure(d, 300, rng)  # warm-up
    idle = measure(d, args.requests, rng)
    stop = threading.Event()
    before = producer.predictor.retrains

    def trainer() -> None:
        p = producer.predictor
        while not stop.wait(0.1):  # 10x the default schedule (retrainInterval 1s)
            p.observe(EndpointState(100, 100, 0, 1, 0.1, 100, 0), 0.08, 0.013)
            p.retrain()

    t = threading.Thread(target=trainer, daemon=True)
    t.start()
    # At least --requests picks, and on until --fits fits have run beside them (a fit of
    # 5,000 samples takes longer than the default phase of picks).
    busy = measure(d, args.requests, rng)
    while producer.predictor.retrains - before < args.fits:
        busy += measure(d, 200, rng)
    stop.set()
    t.join()
    print(f"{args.endpoints} endpoints, route() in process: default profile {pcts(default)}; "
          f"latency profile, model idle {pcts(idle)}; "
          f"retraining ({producer.predictor.retrains - before} fits during the phase) "
          f"{pcts(busy)}")


if __name__ == "__main__":
    main()
