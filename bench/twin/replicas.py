"""Active-active EPP replicas in the twin (issue 18; docs/active-active.md).

``python -m bench.twin.replicas`` plays the shared-prefix schedule of each seed through one
EPP and through ``n`` replicas, in virtual time, so routing quality is separated from CPU:
nothing here competes for cores, and one seed gives the same picks every time.

What is modelled, and how it maps to the real thing:

- **Replicas**: ``n`` real EPPs (:class:`bench.twin.epp_adapter.EppRouter`: config, plugins,
  datastore, director), each with its own endpoint views, its own scrapes and its own state
  store. Requests go to the replicas in turn (Envoy's round robin over ext_proc streams).
- **The store** (:class:`TwinStore`): the same contract as
  :class:`epp.statestore.valkey.ValkeyStateStore` - writes land in a local
  :class:`~epp.statestore.MemoryStateStore` at once and are queued; every ``sync_interval``
  (each replica on its own phase) a sync pushes this replica's own in-flight counts and
  its queued prefix writes, and pulls the others' counts as of their last push. Published
  prefix writes reach the other replicas ``pubsub_latency`` later. ``shared=False`` is
  ``--state-store memory://``: replicas that share nothing. ``--flush-delay`` adds a what-if
  (tried, not adopted): in-flight changes published that long after they happen.
- **Scrapes**: every replica scrapes every server at the loop's scrape instants (the same
  phase for all replicas: a simplification; real replicas scrape on their own phases).
- **CPU** (``--cpu``, off by default): each replica is one core; a pick costs the CPU measured
  on the real EPP (:mod:`bench.twin.cpu`: medians over the rounds of
  ``bench/twin/epp_cpu.json``; sharing replicas pay the cost with the store), exponential
  around it; requests wait while their replica is busy and reach their server when the pick
  is done. Without it a pick is instant.

Not modelled: Valkey's latency beyond ``pubsub_latency``, and lost syncs. The twin answers
"what do separate views cost the routing"; how many picks per second n replicas serve is
:mod:`bench.twin.cpu`'s question (the same CPU model without the model servers).

    python -m bench.twin.replicas [--replicas 2,3] [--seeds 10] [--servers 4] [--load 0.5]
                                  [--sync-interval 0.05] [--flush-delay S] [--duration 20]
                                  [--cpu [FILE]]
    python -m bench.twin.replicas --replay RUN_DIR   # a bench.active_active run's picks
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench.report import RunResult, summarize
from bench.stats import bootstrap_median, paired_ratios
from bench.twin.cpu import MEASURED, Cores, CpuCost, load_rounds
from bench.twin.epp_adapter import SCRAPE_INTERVAL, EppRouter
from bench.twin.loop import ServerState, TwinConfig, run
from bench.workloads import MODEL, WORKLOADS, RequestSpec
from epp.statestore import InFlight, MemoryStateStore, StateStore
from epp.statestore.base import RemoteListener

#: Defaults of the Valkey store (``sync_interval`` URL option) and a loopback pub/sub hop.
SYNC_INTERVAL = 0.05
PUBSUB_LATENCY = 0.001


class TwinStore(StateStore):
    """One replica's store: a local view now, the others' writes when the bus delivers them."""

    kind = "twin"

    def __init__(self, bus: Bus, replica: int) -> None:
        self.bus, self.replica = bus, replica
        self.local = MemoryStateStore()
        #: Prefix writes not yet published: (endpoint, hashes, capacity).
        self.queued: list[tuple[str, list[int], int]] = []

    def add_inflight(self, endpoint: str, requests: int, tokens: int = 0) -> None:
        self.local.add_inflight(endpoint, requests, tokens)
        self.bus.changed(self.replica)

    def inflight(self, endpoint: str) -> InFlight:
        return self.local.inflight(endpoint)

    def prefix_add(self, endpoint: str, hashes: list[int], capacity: int) -> None:
        self.local.prefix_add(endpoint, hashes, capacity)
        if self.bus.shared:
            self.queued.append((endpoint, list(hashes), capacity))

    def prefix_match(self, hashes: list[int]) -> dict[str, int]:
        return self.local.prefix_match(hashes)

    def prefix_retain(self, endpoints: frozenset[str]) -> None:
        self.local.prefix_retain(endpoints)

    def session_set(self, key: str, value: str) -> None:
        self.local.session_set(key, value)

    def session_get(self, key: str) -> str | None:
        return self.local.session_get(key)

    def on_remote_inflight(self, listener: RemoteListener) -> None:
        self.local.on_remote_inflight(listener)

    @property
    def shared(self) -> bool:
        return self.bus.shared


@dataclass
class Bus:
    """Valkey in virtual time: the replicas' published counts and the pub/sub deliveries.

    ``flush_delay`` None is the store as built: a replica sees the others' counts when it
    pulls at its own sync, as of their last push. A number is a what-if that was tried and
    not adopted (docs/active-active.md, Measurements): a change of the counts is pushed that
    much later and reaches the others one pub/sub hop after that."""

    n: int
    shared: bool = True
    sync_interval: float = SYNC_INTERVAL
    pubsub_latency: float = PUBSUB_LATENCY
    flush_delay: float | None = None
    stores: list[TwinStore] = field(default_factory=list)
    #: each replica's counts as of its last push (``ns:inflight:<replica>``)
    published: list[dict[str, tuple[int, int]]] = field(default_factory=list)
    #: ``views[i][j]``: replica j's counts as replica i last got them
    views: list[dict[int, dict[str, tuple[int, int]]]] = field(default_factory=list)
    now: float = 0.0
    _events: list[tuple[float, int, int, tuple[object, ...]]] = field(default_factory=list)
    _flush_pending: set[int] = field(default_factory=set)
    _seq: int = 0

    def __post_init__(self) -> None:
        self.stores = [TwinStore(self, i) for i in range(self.n)]
        self.published = [{} for _ in range(self.n)]
        self.views = [{} for _ in range(self.n)]
        if self.shared and self.n > 1:
            for i in range(self.n):   # replicas sync on evenly spread phases
                self._push(self.sync_interval * i / self.n, i, ("sync",))

    def _push(self, t: float, replica: int, payload: tuple[object, ...]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, replica, payload))

    def changed(self, replica: int) -> None:
        """Replica ``replica``'s own counts changed now."""
        if (self.shared and self.n > 1 and self.flush_delay is not None
                and replica not in self._flush_pending):
            self._flush_pending.add(replica)
            self._push(self.now + self.flush_delay, replica, ("flush",))

    def advance(self, now: float) -> None:
        """Run every sync, flush and delivery due at or before ``now``."""
        events = self._events
        while events and events[0][0] <= now:
            t, _, replica, payload = heapq.heappop(events)
            self.now = t
            kind = payload[0]
            if kind == "sync":
                self._publish(t, replica)
                self._pull(replica)
                self._push(t + self.sync_interval, replica, ("sync",))
            elif kind == "flush":
                self._flush_pending.discard(replica)
                self._publish(t, replica)
            elif kind == "prefix":
                local = self.stores[replica].local
                for endpoint, hashes, capacity in payload[1]:  # type: ignore[attr-defined]
                    local.prefix_add(endpoint, hashes, capacity)
            else:   # "counts": another replica's published counts arrive
                self.views[replica][payload[1]] = payload[2]  # type: ignore[index,assignment]
                self._install(replica)
        self.now = now

    def _publish(self, t: float, i: int) -> None:
        store = self.stores[i]
        counts = {ep: (c[0], c[1]) for ep, c in store.local.own.items()}
        self.published[i] = counts
        for j in range(self.n):
            if j == i:
                continue
            if store.queued:
                self._push(t + self.pubsub_latency, j, ("prefix", store.queued))
            if self.flush_delay is not None:
                self._push(t + self.pubsub_latency, j, ("counts", i, counts))
        store.queued = []

    def _pull(self, i: int) -> None:
        self.views[i] = {j: c for j, c in enumerate(self.published) if j != i}
        self._install(i)

    def _install(self, i: int) -> None:
        totals: dict[str, list[int]] = {}
        for counts in self.views[i].values():
            for ep, (r, tok) in counts.items():
                total = totals.setdefault(ep, [0, 0])
                total[0] += r
                total[1] += tok
        remote: Mapping[str, InFlight] = {ep: InFlight(r, tok) for ep, (r, tok) in totals.items()}
        self.stores[i].local.set_remote(remote)


class Replicas:
    """``n`` EPP replicas behind Envoy's round robin, as one twin router."""

    scrape_interval: float | None = SCRAPE_INTERVAL

    def __init__(self, name: str, keys: list[str], seed: int, n: int, *, shared: bool,
                 sync_interval: float = SYNC_INTERVAL,
                 flush_delay: float | None = None, cpu: CpuCost | None = None) -> None:
        self.name = name
        self.bus = Bus(n, shared=shared, sync_interval=sync_interval, flush_delay=flush_delay)
        self.replicas = [EppRouter(f"{name}-{i}", keys, seed, model=MODEL,
                                   state_store=self.bus.stores[i]) for i in range(n)]
        self._next = 0
        self._owner: dict[int, EppRouter] = {}
        #: with a CPU model: the replicas' cores, and the replica each waiting pick is on
        self.cores = Cores(n, cpu) if cpu is not None else None
        self._assigned: dict[int, int] = {}
        self._costs = random.Random(f"pick-cost:{seed}")
        #: read by the twin's loop: None while picks are instant
        self.pick_done = self._pick_done if cpu is not None else None

    def _pick_done(self, index: int, now: float) -> float:
        """Envoy sends request ``index`` to a replica at ``now``; when its pick is done
        (it waits while that replica's core is busy; the cost is exponential around the
        measured mean)."""
        assert self.cores is not None
        work = self.cores.cost.per_request * self._costs.expovariate(1.0)
        replica, _, end = self.cores.serve(now, work)
        self._assigned[index] = replica
        return end

    def advance(self, now: float) -> None:
        self.bus.advance(now)

    def route(self, index: int, path: str, body: bytes, now: float,
              headers: Mapping[str, str]) -> str:
        if self.cores is not None:
            replica = self.replicas[self._assigned.pop(index)]
        else:
            replica = self.replicas[self._next]
            self._next = (self._next + 1) % len(self.replicas)
        self._owner[index] = replica
        return replica.route(index, path, body, now, headers)

    def done(self, index: int, prompt_tokens: int, completion_tokens: int) -> None:
        self._owner.pop(index).done(index, prompt_tokens, completion_tokens)

    def begin_scrape(self, key: str) -> None:
        for r in self.replicas:
            r.begin_scrape(key)

    def scraped(self, key: str, state: ServerState) -> None:
        for r in self.replicas:
            r.scraped(key, state)


class Replay:
    """The picks a real run made (its ``outcomes.jsonl``), replayed onto the twin's fleet.

    Playing a real run's picks in virtual time separates routing from CPU: if the replayed
    TTFTs show the real run's gap, the picks caused it; if not, the machine did."""

    scrape_interval: float | None = None

    def __init__(self, name: str, keys: list[str], picks: list[str]) -> None:
        self.name = name
        # sim-<i> (bench.contenders.SimFleet's pod names) is the fleet's i-th server.
        self._picks = [keys[int(p.rsplit("-", 1)[1])] if p else keys[0] for p in picks]

    def route(self, index: int, path: str, body: bytes, now: float,
              headers: Mapping[str, str]) -> str:
        return self._picks[index]

    def done(self, index: int, prompt_tokens: int, completion_tokens: int) -> None:
        pass

    def begin_scrape(self, key: str) -> None:
        pass

    def scraped(self, key: str, state: ServerState) -> None:
        pass


def replay(run_dir: Path, time_scale: float = 1.0) -> dict[str, dict[int, RunResult]]:
    """Every ``<seed>/<contender>`` of a ``bench.active_active`` run (taken with
    ``time_scale``), replayed in the twin."""
    rows: dict[str, dict[int, RunResult]] = {}
    for outcomes in sorted(run_dir.glob("*/*/outcomes.jsonl")):
        seed, name = int(outcomes.parent.parent.name), outcomes.parent.name
        lines = outcomes.read_bytes().splitlines()
        picks = {o["index"]: o["pod"] for o in map(orjson.loads, lines)}
        specs = [RequestSpec(**{k: v / time_scale if k == "at" else v
                                for k, v in orjson.loads(line).items()
                                if k in {"at", "path", "body", "tag", "headers"}})
                 for line in (outcomes.parent / "requests.jsonl").read_bytes().splitlines()]
        fleet = len({p for p in picks.values() if p})
        cfg = TwinConfig(servers=max(4, fleet), seed=seed, model=MODEL)
        router = Replay(name, cfg.keys(), [picks.get(i, "") for i in range(len(specs))])
        res = RunResult("shared-prefix", 0.0, 0.0, name, "replay", seed=seed,
                        servers=cfg.servers)
        rows.setdefault(name, {})[seed] = summarize(res, run(specs, router, cfg))
    return rows


Contender = tuple[str, int, bool, float | None]


def contenders(replicas: list[int], flush_delay: float | None = None) -> list[Contender]:
    """(name, n, shared, flush delay): one replica, then per ``n`` the sharing replicas as
    the store is built, replicas that share nothing, and with ``flush_delay`` the what-if of
    published in-flight changes (``-flush``)."""
    out: list[Contender] = [("epp-1", 1, False, None)]
    for n in replicas:
        out += [(f"epp-{n}-shared", n, True, None), (f"epp-{n}-local", n, False, None)]
        if flush_delay is not None:
            out.append((f"epp-{n}-shared-flush", n, True, flush_delay))
    return out


def median_costs(path: Path) -> tuple[CpuCost, CpuCost]:
    """The store-less and the sharing replica's CPU cost, medians over the rounds of a
    ``bench.active_active_throughput --save`` file."""
    rounds, _ = load_rounds(path)
    return (CpuCost(statistics.median(r.alone.per_request for r in rounds)),
            CpuCost(statistics.median(r.shared.per_request for r in rounds)))


def run_seed(seed: int, names: list[Contender], *, load: float, duration: float,
             servers: int, sync_interval: float,
             cpu: tuple[CpuCost, CpuCost] | None = None) -> dict[str, RunResult]:
    """One seed's shared-prefix schedule through every contender; ``cpu``: the store-less and
    the sharing replicas' pick cost (None: instant picks)."""
    wl = WORKLOADS["shared-prefix"]
    specs = wl.schedule(load, duration, seed, servers)
    cfg = TwinConfig(servers=servers, seed=seed, model=MODEL)
    out = {}
    for name, n, shared, flush in names:
        cost = None if cpu is None else cpu[1] if shared and n > 1 else cpu[0]
        router = Replicas(name, cfg.keys(), seed, n, shared=shared, sync_interval=sync_interval,
                          flush_delay=flush, cpu=cost)
        res = RunResult(wl.name, load, load * wl.capacity(servers), name, "ours", seed=seed,
                        servers=servers)
        out[name] = summarize(res, run(specs, router, cfg))
    return out


def report(rows: dict[str, dict[int, RunResult]]) -> list[str]:
    """Median [95% bootstrap interval] over seeds; ratios paired by seed against epp-1."""
    base = rows["epp-1"]
    lines = ["| contender | seeds | hit rate % | hit rate - 1 replica (points) | TTFT p90 s | "
             "TTFT p90 / 1 replica |", "|---|---:|---|---|---|---|"]
    for name, runs in rows.items():
        hit = bootstrap_median([100 * r.cache_hit for r in runs.values()])
        diff = bootstrap_median([100 * (r.cache_hit - base[s].cache_hit)
                                 for s, r in runs.items()])
        p90 = bootstrap_median([r.ttft_p90 for r in runs.values()])
        ratio = bootstrap_median(paired_ratios({s: r.ttft_p90 for s, r in runs.items()},
                                               {s: r.ttft_p90 for s, r in base.items()}))
        lines.append(f"| {name} | {len(runs)} | {hit.median:.1f} [{hit.lo:.1f}, {hit.hi:.1f}] "
                     f"| {diff.median:+.1f} [{diff.lo:+.1f}, {diff.hi:+.1f}] | "
                     f"{p90.median:.3f} [{p90.lo:.3f}, {p90.hi:.3f}] | {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.twin.replicas", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", default="2,3", help="comma-separated replica counts")
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1")
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--load", type=float, default=0.5)
    p.add_argument("--duration", type=float, default=20.0, help="model seconds of arrivals")
    p.add_argument("--sync-interval", type=float, default=SYNC_INTERVAL)
    p.add_argument("--flush-delay", type=float, default=None,
                   help="what-if: also run sharing replicas that publish in-flight changes "
                        "this many seconds after they happen (epp-N-shared-flush)")
    p.add_argument("--replay", type=Path, default=None, metavar="RUN_DIR",
                   help="replay the picks of a bench.active_active run instead")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="with --replay: the run's --time-scale")
    p.add_argument("--cpu", type=Path, nargs="?", const=MEASURED, default=None, metavar="FILE",
                   help="model each replica's CPU with the costs measured in FILE (a "
                        "bench.active_active_throughput --save file; default: "
                        "bench/twin/epp_cpu.json)")
    args = p.parse_args(argv)
    if args.replay is not None:
        replayed = replay(args.replay, args.time_scale)
        if "epp-1" not in replayed:
            p.error(f"--replay: no epp-1 outcomes under {args.replay}")
        print(f"the picks of {args.replay} replayed in the twin (model seconds; same "
              "schedules, no CPU): median [95% bootstrap interval] over seeds")
        print("\n".join(report({"epp-1": replayed.pop("epp-1"), **replayed})))
        return 0
    try:
        counts = [int(x) for x in args.replicas.split(",")]
    except ValueError:
        p.error(f"--replicas: expected integers, got {args.replicas!r}")
    if min(counts) < 2 or args.seeds < 1 or args.sync_interval <= 0:
        p.error("--replicas must be >= 2, --seeds >= 1, --sync-interval > 0")
    names = contenders(counts, args.flush_delay)
    cpu = median_costs(args.cpu) if args.cpu is not None else None
    rows: dict[str, dict[int, RunResult]] = {name: {} for name, *_ in names}
    for seed in range(args.seeds):
        for name, res in run_seed(seed, names, load=args.load, duration=args.duration,
                                  servers=args.servers, sync_interval=args.sync_interval,
                                  cpu=cpu).items():
            rows[name][seed] = res
    cpu_note = ("instant picks" if cpu is None else
                f"picks cost {1000 * cpu[0].per_request:.3f} ms (sharing replicas "
                f"{1000 * cpu[1].per_request:.3f} ms) on a core per replica")
    print(f"twin, shared-prefix, load {args.load:g}, {args.servers} servers, "
          f"{args.duration:g} model s, sync every {args.sync_interval:g} s, {cpu_note}, seeds "
          f"0-{args.seeds - 1}: median [95% bootstrap interval] over seeds, ratios paired by "
          "seed")
    print("\n".join(report(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
