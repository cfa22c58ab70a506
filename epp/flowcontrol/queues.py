"""Queues: one :class:`FlowQueue` per (priority band, fairness id), grouped in a :class:`Band`.

A flow queue keeps its items in two heaps over the band's ordering key: a min-heap for the
head (next to dispatch) and a max-heap for the tail (the first to give up its place when a
higher band needs room). Removal from the middle (TTL, client gone) is O(1): the item is
unlinked and its heap entries become tombstones, skipped when they surface and dropped by a
rebuild once they outnumber the live items, so memory stays proportional to what is queued.
"""

from __future__ import annotations

import heapq
from typing import Any, ClassVar, Protocol, runtime_checkable

from epp.flowcontrol.config import PriorityBandConfig
from epp.flowcontrol.types import QueueItem

_MinEntry = tuple[float, float, int, QueueItem]
_MaxEntry = tuple[float, float, int, QueueItem]
#: Rebuild the heaps when tombstones exceed both this and the live count.
_COMPACT_MIN = 64


@runtime_checkable
class OrderingPolicy(Protocol):
    """Orders requests inside one flow: smaller key goes first (ties: arrival order)."""

    type_name: ClassVar[str]

    def key(self, item: QueueItem) -> tuple[float, float]: ...


@runtime_checkable
class FairnessPolicy(Protocol):
    """Chooses which flow of a band dispatches next."""

    type_name: ClassVar[str]

    def new_state(self) -> Any:
        """Per-band mutable state (e.g. a round-robin cursor)."""
        ...

    def pick(self, band: Band) -> FlowQueue | None: ...


class FlowQueue:
    """The waiting requests of one flow, ordered by the band's ordering policy."""

    __slots__ = ("_dead_max", "_dead_min", "_max", "_min", "band", "fairness_id", "length",
                 "nbytes")

    def __init__(self, band: Band, fairness_id: str) -> None:
        self.band = band
        self.fairness_id = fairness_id
        self.length = 0
        self.nbytes = 0
        self._min: list[_MinEntry] = []
        self._max: list[_MaxEntry] = []
        self._dead_min = 0
        self._dead_max = 0

    def push(self, item: QueueItem) -> None:
        """Queue ``item`` (its key is set from the band's ordering policy)."""
        item.key = k = self.band.ordering.key(item)
        item.queue = self
        heapq.heappush(self._min, (k[0], k[1], item.seq, item))
        heapq.heappush(self._max, (-k[0], -k[1], -item.seq, item))
        self.length += 1
        self.nbytes += item.request.byte_size
        self.band.length += 1
        self.band.nbytes += item.request.byte_size

    def head(self) -> QueueItem | None:
        """The next item to dispatch, without removing it."""
        h = self._min
        while h and h[0][3].queue is not self:
            heapq.heappop(h)
            self._dead_min -= 1
        return h[0][3] if h else None

    def tail(self) -> QueueItem | None:
        """The item that would be dispatched last, without removing it."""
        h = self._max
        while h and h[0][3].queue is not self:
            heapq.heappop(h)
            self._dead_max -= 1
        return h[0][3] if h else None

    def remove(self, item: QueueItem) -> None:
        """Unlink ``item`` (any position); its heap entries become tombstones."""
        if item.queue is not self:
            return
        item.queue = None
        self._dead_min += 1
        self._dead_max += 1
        self.length -= 1
        self.nbytes -= item.request.byte_size
        self.band.length -= 1
        self.band.nbytes -= item.request.byte_size
        if self.length == 0:
            self._min.clear()
            self._max.clear()
            self._dead_min = self._dead_max = 0
        elif max(self._dead_min, self._dead_max) > max(_COMPACT_MIN, self.length):
            self._compact()

    def items(self) -> list[QueueItem]:
        """The live items, in no particular order (a copy: safe to finalize while walking)."""
        return [e[3] for e in self._min if e[3].queue is self]

    def heap_entries(self) -> int:
        """Entries held by both heaps, tombstones included: at most 4 * live + 130."""
        return len(self._min) + len(self._max)

    def _compact(self) -> None:
        self._min = [e for e in self._min if e[3].queue is self]
        self._max = [e for e in self._max if e[3].queue is self]
        heapq.heapify(self._min)
        heapq.heapify(self._max)
        self._dead_min = self._dead_max = 0


class Band:
    """One priority level: its flows, capacity and policies."""

    __slots__ = ("config", "fairness", "fairness_state", "flows", "inflight", "length",
                 "nbytes", "ordering", "priority")

    def __init__(self, config: PriorityBandConfig, ordering: OrderingPolicy,
                 fairness: FairnessPolicy) -> None:
        self.priority = config.priority
        self.config = config
        self.ordering = ordering
        self.fairness = fairness
        self.fairness_state: Any = fairness.new_state()
        self.flows: dict[str, FlowQueue] = {}
        #: Per fairness id, its requests that picked an endpoint and have not ended (only
        #: ids with some: a flow's count goes when it reaches 0, like an empty flow queue).
        self.inflight: dict[str, int] = {}
        self.length = 0
        self.nbytes = 0

    def flow(self, fairness_id: str) -> FlowQueue:
        """The flow queue for ``fairness_id``, created on first use."""
        q = self.flows.get(fairness_id)
        if q is None:
            q = self.flows[fairness_id] = FlowQueue(self, fairness_id)
        return q

    def drop_if_empty(self, q: FlowQueue) -> None:
        """Forget an empty flow, so fairness ids sent by clients cannot pile up."""
        if q.length == 0 and self.flows.get(q.fairness_id) is q:
            del self.flows[q.fairness_id]

    def started(self, fairness_id: str) -> None:
        """One more request of ``fairness_id`` in flight on the pool."""
        self.inflight[fairness_id] = self.inflight.get(fairness_id, 0) + 1

    def ended(self, fairness_id: str) -> None:
        """One request of ``fairness_id`` ended; never below 0."""
        n = self.inflight.get(fairness_id, 0) - 1
        if n > 0:
            self.inflight[fairness_id] = n
        else:
            self.inflight.pop(fairness_id, None)

    def fits(self, nbytes: int) -> bool:
        """Would one more request of ``nbytes`` stay within this band's own limits?"""
        c = self.config
        if self.nbytes + nbytes > c.effective_max_bytes:
            return False
        return self.length + 1 <= c.effective_max_requests
