"""The EPP's CPU in the replica twin: how many requests per second 1-3 replicas sustain, with
and without sharing (issue 18's throughput bullet; docs/active-active.md).

:mod:`bench.twin.replicas` answers what separate views cost the routing, with instant picks.
This module adds what it leaves out, the EPP's CPU, as a queueing model:

- **A replica is one core.** The EPP is one Python process; its picks and its ext_proc
  message handling hold the interpreter. A request costs its replica ``per_request`` seconds
  of CPU (pick plus ext_proc handling), drawn per request from a gamma distribution with that
  mean and coefficient of variation ``cv`` (1: exponential; 0: constant). The measured cost
  holds the replica's background work at the measured rate (scrapes, and the store's syncs
  for a sharing replica). ``--background F`` is a what-if on top: sharing replicas lose a
  further fraction F of their core to syncs, so their requests take ``per_request / (1 - F)``.
- **A request waits while its replica is busy** (first come, first served).
- **Envoy spreads the ext_proc streams** over the replica cluster: ``round-robin`` (the
  devkit's replica cluster, Envoy's default) or ``least-request`` (the replica with the fewest
  picks outstanding; Envoy samples two hosts, which with 2-3 replicas is nearly the same).
- **Nothing else needs a core**: Envoy, the client and the model servers have their own (what
  the 2-core machine could not give them), and the pods answer at once, as in the real
  bench. Valkey's CPU is reported by the real bench (~0.06 ms per request, a core for
  ~16,000 req/s) and not modelled.

The inputs are measured on the real EPP: ``python -m bench.micro active-active --save
FILE`` writes per round the CPU per request of a store-less EPP and of the serving replica of
a sharing pair (each process's own CPU over the round). The twin's seed ``k``
takes round ``k mod R`` (the two figures of a round stay together), so the interval over seeds
carries the rounds' spread; the seed also draws the arrivals and the per-request costs.

Two figures per contender and seed:

- **saturated req/s**: closed loop, ``concurrency`` connections, each sending its next request
  as soon as its pick is done (the real bench's client, with free cores for it);
- **sustainable req/s**: the highest Poisson arrival rate at which the 99th percentile of the
  wait for a replica's core stays within ``bound`` (bisection on the rate; the same unit
  arrivals and costs at every rate, so the waits grow with the rate).

    python -m bench.twin.cpu [--cpu FILE] [--replicas 1,2,3] [--seeds 16] [--requests 20000]
                             [--cv 1] [--bound 0.01] [--balance round-robin|least-request]
                             [--background 0]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import heapq
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.stats import Interval, bootstrap_median, quantile, verdict

#: The committed measurement (its command, date and load average are inside).
MEASURED = Path(__file__).with_name("epp_cpu.json")
BALANCES = ("round-robin", "least-request")


@dataclass(slots=True)
class ProcessCpu:
    """One EPP process's CPU, per request and per streamed token, under a CPU budget (a pod's
    limit): the routing twin's EPP (:mod:`bench.twin.loop`), each of its replicas, and each
    replica core of this module's throughput model (``per_token`` 0; ``idle``: the share of
    the core a sharing replica's syncs take).

    Costs are CPU seconds measured on the real EPP (``bench.epp_cpu --save``): a request costs
    ``per_request`` when it is picked, every streamed token ``per_token`` when its chunk crosses
    the ext_proc stream, and background work (scraping the pool's pods) holds ``idle`` of a
    CPU. The process
    does one piece of work at a time, first come first served, at ``cpus`` CPUs (at most one:
    one Python interpreter). A piece that arrives while it is busy waits: a late pick starts
    the request late on its server, a late chunk reaches the client late.
    """

    per_request: float
    per_token: float
    cpus: float = 1.0
    idle: float = 0.0
    #: when the work taken so far is done (model seconds)
    free_at: float = 0.0

    def __post_init__(self) -> None:
        if self.per_request < 0 or self.per_token < 0 or not 0 <= self.idle < min(1, self.cpus):
            raise ValueError(f"bad EPP CPU model {self}: costs >= 0, 0 <= idle < cpus")

    @property
    def capacity(self) -> float:
        """Requests per second the process serves when always busy."""
        return (min(self.cpus, 1.0) - self.idle) / self.per_request

    def run(self, now: float, work: float) -> float:
        """Work of ``work`` CPU seconds arriving at ``now``: when it is done."""
        speed = min(self.cpus, 1.0) - self.idle
        self.free_at = max(now, self.free_at) + work / speed
        return self.free_at

    def pick_done(self, index: int, now: float) -> float:
        """When the pick of a request arriving at ``now`` is done."""
        return self.run(now, self.per_request)

    @classmethod
    def measured(cls, path: Path, cpus: float, servers: int) -> ProcessCpu:
        """The default profile's median costs saved by ``bench.epp_cpu --save PATH``, for a
        pool of ``servers`` pods (the idle cost is the measured scraping cost per pod)."""
        saved = json.loads(path.read_text())
        costs = saved["contenders"]["EPP default profile"]
        return cls(costs["per_request"], costs["per_token"], cpus,
                   saved["scrape_per_pod"] * servers)


#: The EPP's CPU costs measured here (``bench.epp_cpu --save``), which the twin's EPP CPU model
#: reads for a router CPU budget in virtual time.
MEASURED_COST = Path(__file__).with_name("epp_cost.json")


class Cores:
    """``n`` single-core replicas behind Envoy's balancer; times in seconds."""

    def __init__(self, n: int, cost: ProcessCpu, balance: str = "round-robin") -> None:
        if n < 1 or balance not in BALANCES:
            raise ValueError(f"need n >= 1 and a balance in {BALANCES}")
        self.balance = balance
        self.cores = [dataclasses.replace(cost) for _ in range(n)]
        #: per replica, the end times of its picks not yet done (FIFO: in order)
        self._ends: list[collections.deque[float]] = [collections.deque() for _ in range(n)]
        self._next = 0

    def choose(self, now: float) -> int:
        """The replica Envoy sends a stream opened at ``now`` to: the next in turn, or with
        ``least-request`` the one with the fewest picks outstanding (ties: the next in turn,
        so none is favoured)."""
        n = len(self.cores)
        order = [(self._next + k) % n for k in range(n)]
        if self.balance == "least-request":
            for ends in self._ends:
                while ends and ends[0] <= now:
                    ends.popleft()
            order.sort(key=lambda i: len(self._ends[i]))   # stable: ties keep their turn
        self._next = (order[0] + 1) % n
        return order[0]

    def serve(self, now: float, work: float) -> tuple[int, float, float]:
        """A request arriving at ``now`` that needs ``work`` CPU seconds: its replica, and when
        its pick starts and ends (it waits while the replica is busy)."""
        r = self.choose(now)
        start = max(now, self.cores[r].free_at)
        end = self.cores[r].run(now, work)
        self._ends[r].append(end)
        return r, start, end


@dataclass(frozen=True, slots=True)
class Draws:
    """One seed's random numbers, shared by every rate and contender (common random numbers):
    unit-mean gaps between arrivals and unit-mean factors on the per-request cost."""

    gaps: tuple[float, ...]
    factors: tuple[float, ...]

    @classmethod
    def make(cls, seed: int, requests: int, cv: float) -> Draws:
        rng = random.Random(f"twin-cpu:{seed}")
        gaps = tuple(rng.expovariate(1.0) for _ in range(requests))
        if cv == 0:
            factors = (1.0,) * requests
        else:   # gamma with mean 1 and the given coefficient of variation
            shape = 1 / cv ** 2
            factors = tuple(rng.gammavariate(shape, 1 / shape) for _ in range(requests))
        return cls(gaps, factors)


def open_loop_waits(rate: float, n: int, cost: ProcessCpu, draws: Draws,
                    balance: str = "round-robin") -> list[float]:
    """Poisson arrivals at ``rate`` req/s onto ``n`` replicas: each request's wait for its
    replica's core."""
    cores = Cores(n, cost, balance)
    t, waits = 0.0, []
    for gap, factor in zip(draws.gaps, draws.factors, strict=True):
        t += gap / rate
        _, start, _ = cores.serve(t, cost.per_request * factor)
        waits.append(start - t)
    return waits


def saturated_rps(n: int, cost: ProcessCpu, draws: Draws, concurrency: int = 32,
                  balance: str = "round-robin") -> float:
    """Closed loop: ``concurrency`` connections each send their next request when the last
    one's pick is done; requests per second over ``len(draws.factors)`` requests."""
    cores = Cores(n, cost, balance)
    ready = [0.0] * concurrency      # when each connection sends its next request
    heapq.heapify(ready)
    last = 0.0
    for factor in draws.factors:
        now = heapq.heappop(ready)
        _, _, end = cores.serve(now, cost.per_request * factor)
        heapq.heappush(ready, end)
        last = max(last, end)
    return len(draws.factors) / last


def sustainable_rps(n: int, cost: ProcessCpu, draws: Draws, bound: float,
                    balance: str = "round-robin", steps: int = 18) -> float:
    """The highest Poisson rate (req/s) whose 99th-percentile wait stays within ``bound``
    seconds (bisection between 0 and the replicas' capacity: above it the queue grows without
    end, however long a finite run stays within the bound)."""
    lo, hi = 0.0, n * cost.capacity
    for _ in range(steps):
        mid = (lo + hi) / 2
        if quantile(open_loop_waits(mid, n, cost, draws, balance), 0.99) <= bound:
            lo = mid
        else:
            hi = mid
    return lo


def load_rounds(path: Path) -> tuple[list[tuple[float, float]], dict[str, object]]:
    """The rounds ``bench.micro active-active --save`` wrote, as (store-less EPP, sharing
    replica) CPU seconds per request, and the file's header."""
    try:
        doc = json.loads(path.read_text())
        rounds = [(r["none_ms"] / 1000, r["shared_ms"] / 1000) for r in doc["rounds"]]
        if any(cost <= 0 for r in rounds for cost in r):
            raise ValueError(f"bad CPU cost in {rounds}: per request > 0")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"{path}: not a bench.micro active-active --save file ({exc})") from None
    if not rounds:
        raise SystemExit(f"{path}: rounds: empty")
    return rounds, {k: v for k, v in doc.items() if k != "rounds"}


#: (replicas, sharing) -> (saturated, sustainable) req/s by seed
Figures = dict[tuple[int, bool], tuple[dict[int, float], dict[int, float]]]
#: The paired verdicts: replicas sharing, what their saturated req/s over one store-less
#: replica's says, its target (at least).
TARGETS = ((1, "per-replica cost of sharing, saturated req/s of a sharing replica / a "
            "store-less one", 0.9),
           (2, "2 sharing replicas / 1 store-less replica, saturated req/s", 1.7))


def run(rounds: Sequence[tuple[float, float]], replicas: Sequence[int], *, seeds: int,
        requests: int, cv: float, bound: float, concurrency: int, balance: str,
        background: float = 0.0) -> Figures:
    """Every replica count without and with the store on every seed; seed ``k`` uses
    measured round ``k mod len(rounds)``; ``background``: the what-if share of a sharing
    replica's core lost to syncs."""
    out: Figures = {(n, shared): ({}, {}) for n in replicas for shared in (False, True)}
    for seed in range(seeds):
        alone, sharing = rounds[seed % len(rounds)]
        draws = Draws.make(seed, requests, cv)
        for (n, shared), (saturated, sustainable) in out.items():
            cost = ProcessCpu(sharing, 0.0, idle=background) if shared else ProcessCpu(alone, 0.0)
            saturated[seed] = saturated_rps(n, cost, draws, concurrency, balance)
            sustainable[seed] = sustainable_rps(n, cost, draws, bound, balance)
    return out


def report(fig: Figures) -> list[str]:
    """Median [95% bootstrap interval] over seeds; ratios paired by seed with one store-less
    replica."""
    def ratio(xs: dict[int, float], base: dict[int, float]) -> Interval:
        return bootstrap_median([xs[s] / base[s] for s in sorted(xs)])

    def fmt(xs: dict[int, float]) -> str:
        iv = bootstrap_median(list(xs.values()))
        return f"{iv.median:.0f} [{iv.lo:.0f}, {iv.hi:.0f}]"

    base = fig[1, False]
    lines = ["| contender | seeds | saturated req/s | / 1 replica alone | sustainable req/s "
             "(p99 wait within bound) | / 1 replica alone |", "|---|---:|---|---|---|---|"]
    for (n, shared), (sat, sus) in fig.items():
        lines.append(f"| epp-{n}-{'shared' if shared else 'alone'} | {len(sat)} | {fmt(sat)} | "
                     f"{ratio(sat, base[0])} | {fmt(sus)} | {ratio(sus, base[1])} |")
    lines.append("")
    for n, what, target in TARGETS:
        if (n, True) in fig:
            iv = ratio(fig[n, True][0], base[0])
            lines.append(f"- {what}: {iv} (target >= {target:g}): "
                         f"**{verdict(iv, target, at_most=False)}**")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.twin.cpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", type=Path, default=MEASURED,
                   help="a bench.micro active-active --save file (default: the committed "
                        "measurement)")
    p.add_argument("--replicas", default="1,2,3", help="comma-separated replica counts")
    p.add_argument("--seeds", type=int, default=16, help="seeds 0..N-1")
    p.add_argument("--requests", type=int, default=20000, help="requests per simulation")
    p.add_argument("--cv", type=float, default=1.0,
                   help="coefficient of variation of the per-request cost (1: exponential)")
    p.add_argument("--bound", type=float, default=0.01,
                   help="p99 wait (seconds) that counts as sustainable")
    p.add_argument("--concurrency", type=int, default=32, help="closed-loop connections")
    p.add_argument("--balance", choices=BALANCES, default="round-robin")
    p.add_argument("--background", type=float, default=0.0,
                   help="what-if: sharing replicas lose this fraction of their core to syncs "
                        "on top of the measured cost")
    args = p.parse_args(argv)
    try:
        counts = [int(x) for x in args.replicas.split(",")]
    except ValueError:
        p.error(f"--replicas: expected integers, got {args.replicas!r}")
    if 1 not in counts:
        counts = [1, *counts]   # the baseline
    if (min(counts) < 1 or args.seeds < 1 or args.requests < 100 or args.cv < 0
            or args.bound <= 0 or args.concurrency < 1 or not 0 <= args.background < 1):
        p.error("need --replicas >= 1, --seeds >= 1, --requests >= 100, --cv >= 0, "
                "--bound > 0, --concurrency >= 1, 0 <= --background < 1")
    rounds, header = load_rounds(args.cpu)
    fig = run(rounds, counts, seeds=args.seeds, requests=args.requests, cv=args.cv,
              bound=args.bound, concurrency=args.concurrency, balance=args.balance,
              background=args.background)
    what_if = f", sharing replicas lose {args.background:g} of a core" if args.background else ""
    print(f"twin CPU model{what_if}: a core per replica, {args.balance}, {args.requests} "
          f"requests per run, cost cv {args.cv:g}, p99 wait bound {1000 * args.bound:g} ms, "
          f"{args.concurrency} closed-loop connections, seeds 0-{args.seeds - 1} over "
          f"{len(rounds)} measured rounds ({args.cpu.name}: {header.get('command')}, "
          f"{header.get('date')}, load average {header.get('load_average')}); median [95% "
          "bootstrap interval] over seeds, ratios paired by seed")
    print("\n".join(report(fig)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
