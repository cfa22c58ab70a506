"""Active-active EPP replicas in the twin (issue 18; docs/active-active.md): a scenario's
contender ``{name, replicas: {count: N, store: valkey | memory}}`` in virtual time
(``bench/scenarios/active-active.yaml``), so routing quality is separated from CPU: nothing
here competes for cores, and one seed gives the same picks every time.

What is modelled, and how it maps to the real thing:

- **Replicas**: ``n`` real EPPs (:class:`bench.twin.epp_adapter.EppRouter`: config, plugins,
  datastore, director), each with its own endpoint views, its own scrapes and its own state
  store. Requests go to the replicas in turn (Envoy's round robin over ext_proc streams).
- **The store** (:class:`TwinStore`): the same contract as
  :class:`epp.statestore.valkey.ValkeyStateStore` - writes land in the local view at once and
  prefix writes are queued; every ``sync_interval`` (each replica on its own phase) a sync
  pushes this replica's own in-flight counts and its queued prefix writes, and pulls the
  others' counts as of their last push. Published prefix writes reach the other replicas
  ``pubsub_latency`` later. ``shared=False`` is ``--state-store memory://``: replicas that
  share nothing. (A what-if that pushed every change of the counts a few ms after it
  happened was tried and not adopted: docs/active-active.md, Measurements.)
- **Scrapes**: every replica scrapes every server at the loop's scrape instants (the same
  phase for all replicas: a simplification; real replicas scrape on their own phases).
- **CPU** (``cpu``, off by default; a scenario's ``budget.router_cpus``): each replica is
  its own process with its own copy of the EPP's CPU model (:class:`bench.twin.cpu.ProcessCpu`:
  the measured cost per pick and per streamed token at that budget); a request waits while
  its replica is busy and reaches its server when the pick is done, its tokens reach the
  client when its replica has passed them on. Without it a pick is instant.

Not modelled: Valkey's latency beyond ``pubsub_latency``, and lost syncs. The twin answers
"what do separate views cost the routing"; how many picks per second n replicas serve is
:mod:`bench.twin.cpu`'s question (the same CPU model without the model servers).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.twin.cpu import ProcessCpu
from bench.twin.epp_adapter import SCRAPE_INTERVAL, EppRouter
from bench.twin.loop import ServerState
from bench.workloads import MODEL
from epp.statestore import InFlight, MemoryStateStore

#: Defaults of the Valkey store (``sync_interval`` URL option) and a loopback pub/sub hop.
SYNC_INTERVAL = 0.05
PUBSUB_LATENCY = 0.001
#: Prefix writes as the store queues and publishes them: (endpoint, hashes, capacity).
Writes = list[tuple[str, list[int], int]]


class TwinStore(MemoryStateStore):
    """One replica's store: its own writes in its view now, the others' when the bus
    delivers them."""

    kind = "twin"

    def __init__(self, bus: Bus) -> None:
        super().__init__()
        self.bus = bus
        #: Prefix writes not yet published.
        self.queued: Writes = []

    def prefix_add(self, endpoint: str, hashes: list[int], capacity: int) -> None:
        super().prefix_add(endpoint, hashes, capacity)
        if self.bus.shared:
            self.queued.append((endpoint, list(hashes), capacity))

    def deliver(self, writes: Writes) -> None:
        """Another replica's published prefix writes arrive."""
        for endpoint, hashes, capacity in writes:
            super().prefix_add(endpoint, hashes, capacity)

    @property
    def shared(self) -> bool:
        return self.bus.shared


@dataclass
class Bus:
    """Valkey in virtual time: the replicas' published counts and the pub/sub deliveries. A
    replica sees the others' counts when it pulls at its own sync, as of their last push."""

    n: int
    shared: bool = True
    sync_interval: float = SYNC_INTERVAL
    pubsub_latency: float = PUBSUB_LATENCY
    stores: list[TwinStore] = field(default_factory=list)
    #: each replica's counts as of its last push (``ns:inflight:<replica>``)
    published: list[dict[str, tuple[int, int]]] = field(default_factory=list)
    #: (time, seq, replica, prefix writes to deliver to it, or None: its sync)
    _events: list[tuple[float, int, int, Writes | None]] = field(default_factory=list)
    _seq: int = 0

    def __post_init__(self) -> None:
        self.stores = [TwinStore(self) for _ in range(self.n)]
        self.published = [{} for _ in range(self.n)]
        if self.shared and self.n > 1:
            for i in range(self.n):   # replicas sync on evenly spread phases
                self._push(self.sync_interval * i / self.n, i, None)

    def _push(self, t: float, replica: int, writes: Writes | None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, replica, writes))

    def advance(self, now: float) -> None:
        """Run every sync and delivery due at or before ``now``."""
        events = self._events
        while events and events[0][0] <= now:
            t, _, replica, writes = heapq.heappop(events)
            if writes is not None:
                self.stores[replica].deliver(writes)
                continue
            self._sync(t, replica)
            self._push(t + self.sync_interval, replica, None)

    def _sync(self, t: float, i: int) -> None:
        """Replica ``i`` pushes its counts and queued prefix writes and pulls the others'."""
        store = self.stores[i]
        self.published[i] = {ep: (c[0], c[1]) for ep, c in store.own.items()}
        if store.queued:
            for j in range(self.n):
                if j != i:
                    self._push(t + self.pubsub_latency, j, store.queued)
            store.queued = []
        totals: dict[str, list[int]] = {}
        for j, counts in enumerate(self.published):
            if j == i:
                continue
            for ep, (r, tok) in counts.items():
                total = totals.setdefault(ep, [0, 0])
                total[0] += r
                total[1] += tok
        remote: Mapping[str, InFlight] = {ep: InFlight(r, tok) for ep, (r, tok) in totals.items()}
        store.set_remote(remote)


class Replicas:
    """``n`` EPP replicas behind Envoy's round robin, as one twin router."""

    scrape_interval: float | None = SCRAPE_INTERVAL

    def __init__(self, name: str, keys: list[str], seed: int, n: int, *, shared: bool,
                 cpu: ProcessCpu | None = None, config_file: Path | None = None) -> None:
        self.name = name
        self.bus = Bus(n, shared=shared)
        self.replicas = [EppRouter(f"{name}-{i}", keys, seed, model=MODEL,
                                   config_file=config_file, state_store=self.bus.stores[i],
                                   cpu=dataclasses.replace(cpu) if cpu is not None else None)
                         for i in range(n)]
        self._next = 0
        self._owner: dict[int, EppRouter] = {}
        if cpu is not None:  # read by the twin's loop: picks take time
            self.pick_done = self._pick_done
        #: KV events reach every replica (each subscribes to every server)
        self.kv_events = self._kv_events if self.replicas[0].kv_events else None

    def _kv_events(self, key: str, events: list[Any]) -> None:
        for r in self.replicas:
            r._index_events(key, events)

    def _pick_done(self, index: int, now: float) -> float:
        """Envoy sends request ``index`` to the next replica at ``now``; when its pick is
        done (it waits while that replica's process is busy)."""
        replica = self._owner[index] = self._turn()
        return replica.pick_done(index, now)

    def _turn(self) -> EppRouter:
        replica = self.replicas[self._next]
        self._next = (self._next + 1) % len(self.replicas)
        return replica

    def advance(self, now: float) -> None:
        self.bus.advance(now)

    def route(self, index: int, path: str, body: bytes, now: float,
              headers: Mapping[str, str]) -> str:
        replica = self._owner.get(index) or self._turn()
        self._owner[index] = replica
        return replica.route(index, path, body, now, headers)

    def done(self, index: int, prompt_tokens: int, completion_tokens: int,
             now: float) -> tuple[float | None, ...] | None:
        return self._owner.pop(index).done(index, prompt_tokens, completion_tokens, now)

    def token(self, index: int, now: float, first: bool) -> float:
        return self._owner[index].token(index, now, first)

    def begin_scrape(self, key: str) -> None:
        for r in self.replicas:
            r.begin_scrape(key)

    def scraped(self, key: str, state: ServerState) -> None:
        for r in self.replicas:
            r.scraped(key, state)
