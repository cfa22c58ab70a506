"""Flow-control policies under upstream v1.5's plugin type names.

Three tiers pick the next request to dispatch (upstream's "3-tier dispatch hierarchy"):

1. priority: the highest non-empty band first; a band may go only while the pool's saturation
   is below its usage limit (``static-usage-limit-policy``), else dispatch stops there
   (head-of-line blocking, so lower bands never take what a higher one waits for);
2. fairness, between the flows (tenants) of a band: ``global-strict-fairness-policy`` (the best
   head across all flows, as if the band were one queue), ``round-robin-fairness-policy``
   (flows in turn, sorted by fairness id, resuming after the last one served) or our
   ``least-inflight-fairness-policy`` (the flow holding the fewest requests in flight);
3. ordering, inside a flow: ``fcfs-ordering-policy`` (arrival), ``edf-ordering-policy``
   (enqueue time + TTL; no TTL sorts last) or ``slo-deadline-ordering-policy`` (arrival +
   ``x-slo-ttft-ms``; no or bad header sorts last). Ties fall back to arrival order.

They are plugins (``plugins:`` entries referenced by name from ``flowControl``); none takes
parameters except the usage-limit policies: ``static-usage-limit-policy`` (``threshold``,
default 1.0, for every band) and our ``priority-usage-limit-policy`` (a ceiling per priority).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from epp.flowcontrol.budgets import BUDGET_PLUGINS
from epp.flowcontrol.config import FlowControlConfigError
from epp.flowcontrol.eviction import EVICTION_PLUGINS
from epp.flowcontrol.program_aware import ProgramAwareFairness

# The policy interfaces live with the queues they order (so queues.py need not import this
# module); they are imported here for the policies below and for callers of this module.
from epp.flowcontrol.queues import Band, FairnessPolicy, FlowQueue, OrderingPolicy  # noqa: F401
from epp.flowcontrol.token_fairness import TokenFairness
from epp.flowcontrol.types import QueueItem
from epp.flowcontrol.usage_limits import USAGE_LIMIT_PLUGINS
from shared.plugins import Plugin

#: The TTFT SLO header (llm-d-router v0.10's name, then its deprecated alias).
SLO_TTFT_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")


@runtime_checkable
class ServiceAccounting(Protocol):
    """A fairness policy that counts the tokens each flow was served (told by the flow
    controller at dispatch and at the end of each response)."""

    def started(self, fairness_id: str, prompt_tokens: int) -> None: ...

    def served(self, fairness_id: str, prompt_tokens: int, completion_tokens: int,
               cached_tokens: int, estimated_prompt_tokens: int) -> None: ...


@runtime_checkable
class UsageLimitPolicy(Protocol):
    """Per priority (highest first), the saturation below which that band may dispatch."""

    type_name: ClassVar[str]

    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]: ...


class FCFSOrdering(Plugin):
    """First come, first served: key = logical enqueue time."""

    type_name: ClassVar[str] = "fcfs-ordering-policy"

    def key(self, item: QueueItem) -> tuple[float, float]:
        return (item.enqueued_at, 0.0)


class EDFOrdering(Plugin):
    """Earliest deadline first: key = enqueue time + effective TTL (∞ without a TTL)."""

    type_name: ClassVar[str] = "edf-ordering-policy"

    def key(self, item: QueueItem) -> tuple[float, float]:
        deadline = math.inf if item.deadline is None else item.deadline
        return (deadline, item.enqueued_at)


class SLODeadlineOrdering(Plugin):
    """Earliest SLO deadline first: key = arrival + ``x-llm-d-slo-ttft-ms`` (or its old
    name ``x-slo-ttft-ms``; ∞ when absent/bad)."""

    type_name: ClassVar[str] = "slo-deadline-ordering-policy"

    def key(self, item: QueueItem) -> tuple[float, float]:
        headers = item.request.headers
        raw = next((v for h in SLO_TTFT_HEADERS if (v := headers.get(h))), "").strip()
        deadline = math.inf
        if raw.isdigit():
            deadline = item.received_at + int(raw) / 1000.0
        return (deadline, item.received_at)


class GlobalStrictFairness(Plugin):
    """The flow whose head is the band's best item: the band behaves as one queue."""

    type_name: ClassVar[str] = "global-strict-fairness-policy"

    def new_state(self) -> None:
        return None

    def pick(self, band: Band) -> FlowQueue | None:
        best: FlowQueue | None = None
        best_key: tuple[float, float, int] | None = None
        for flow in band.flows.values():
            head = flow.head()
            if head is None:
                continue
            k = (*head.key, head.seq)
            if best_key is None or k < best_key:
                best, best_key = flow, k
        return best


class _Cursor:
    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: str | None = None


class RoundRobinFairness(Plugin):
    """Flows in turn: sorted by fairness id, starting after the one served last."""

    type_name: ClassVar[str] = "round-robin-fairness-policy"

    def new_state(self) -> _Cursor:
        return _Cursor()

    def pick(self, band: Band) -> FlowQueue | None:
        turn = self._in_turn(band)
        return self._serve(band, turn[0]) if turn else None

    @staticmethod
    def _in_turn(band: Band) -> list[str]:
        """The waiting flows' ids in turn: sorted, starting after the one served last
        (wrapping; works even if that flow is gone). None waiting resets the turn."""
        cursor: _Cursor = band.fairness_state
        ids = sorted(fid for fid, f in band.flows.items() if f.length)
        if not ids:
            cursor.last = None
            return ids
        start = 0
        if cursor.last is not None:
            start = next((i for i, fid in enumerate(ids) if fid > cursor.last), 0)
        return ids[start:] + ids[:start]

    @staticmethod
    def _serve(band: Band, fairness_id: str) -> FlowQueue:
        band.fairness_state.last = fairness_id
        return band.flows[fairness_id]


class LeastInflightFairness(RoundRobinFairness):
    """The flow with the fewest requests in flight on the pool (picked an endpoint, response
    not ended) goes next; ties in turn, as ``round-robin-fairness-policy``.

    Round-robin shares *dispatches* between the flows that are waiting; this shares the
    pool's *slots*. Under a flood the flooding tenant holds nearly every slot, so a request
    of a tenant with few in flight is released at the next free slot instead of waiting for
    its turn behind the flood (max-min fairness over the requests each tenant holds). A
    heavy flow is never starved: once it holds the fewest, it goes next. Ours, not
    upstream's (v1.5 has global-strict and round-robin only).
    """

    type_name: ClassVar[str] = "least-inflight-fairness-policy"

    def pick(self, band: Band) -> FlowQueue | None:
        turn = self._in_turn(band)
        if not turn:
            return None
        inflight = band.inflight
        # min() keeps the first of equals: ties go in turn
        return self._serve(band, min(turn, key=lambda fid: inflight.get(fid, 0)))


@dataclass(frozen=True, slots=True)
class StaticUsageLimitParameters:
    """``static-usage-limit-policy`` parameters (upstream's)."""

    #: Bands dispatch while the pool's saturation is below this.
    threshold: float = 1.0

    def __post_init__(self) -> None:
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) \
                or t <= 0:
            raise ValueError(f"threshold: must be a positive number, got {t!r}")


class StaticUsageLimit(Plugin):
    """The same ceiling for every band: dispatch while saturation < ``threshold``."""

    type_name: ClassVar[str] = "static-usage-limit-policy"
    parameters_type = StaticUsageLimitParameters
    params: StaticUsageLimitParameters

    def __init__(self, name: str | float = "", params: Any = None) -> None:
        if isinstance(name, int | float):  # StaticUsageLimit(0.5)
            name, params = "", StaticUsageLimitParameters(float(name))
        super().__init__(name, params)

    @property
    def threshold(self) -> float:
        return self.params.threshold

    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        return [self.threshold] * len(priorities)


@dataclass(frozen=True, slots=True)
class BandThreshold:
    """One band's usage limit in ``priority-usage-limit-policy``."""

    priority: int
    threshold: float


@dataclass(frozen=True, slots=True)
class PriorityUsageLimitParameters:
    """``priority-usage-limit-policy`` parameters: ``threshold`` for every band not listed in
    ``bands``, which give single priorities their own (lower) ceiling."""

    threshold: float = 1.0
    bands: tuple[BandThreshold, ...] = ()

    def __post_init__(self) -> None:
        StaticUsageLimitParameters(self.threshold)  # same check
        seen: set[int] = set()
        for b in self.bands:
            if isinstance(b.priority, bool) or not isinstance(b.priority, int):
                raise ValueError(f"bands: priority must be an integer, got {b.priority!r}")
            if b.priority in seen:
                raise ValueError(f"bands: priority {b.priority} is listed twice")
            seen.add(b.priority)
            try:
                StaticUsageLimitParameters(b.threshold)
            except ValueError as e:
                raise ValueError(f"bands[priority {b.priority}].{e}") from None


class PriorityUsageLimit(Plugin):
    """A ceiling per priority: the listed bands' own ``threshold``, every other band the
    default one. A lower band with a ceiling below 1 stops dispatching while the pool is
    still below full, so the capacity above its ceiling stays free for higher bands: e.g.
    ``bands: [{priority: -1, threshold: 0.6}]`` keeps 40% of the pool (by the saturation
    detector's measure) for requests of priority >= 0 under a sheddable flood.

    Ours, not upstream's: upstream v1.5 defines the per-priority contract (``ComputeLimit``
    returns a ceiling per priority; "values between 0.0 and 1.0 reserve capacity headroom")
    but ships only the static policy, whose one ceiling applies to every band.
    """

    type_name: ClassVar[str] = "priority-usage-limit-policy"
    parameters_type = PriorityUsageLimitParameters
    params: PriorityUsageLimitParameters

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)
        self._by_priority = {b.priority: b.threshold for b in self.params.bands}

    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        default = self.params.threshold
        return [self._by_priority.get(p, default) for p in priorities]


#: The built-in policy plugin types (the EPP's registry includes them).
POLICY_PLUGINS: tuple[type[Plugin], ...] = (
    FCFSOrdering, EDFOrdering, SLODeadlineOrdering, GlobalStrictFairness, RoundRobinFairness,
    LeastInflightFairness, StaticUsageLimit, PriorityUsageLimit, ProgramAwareFairness,
    TokenFairness, *USAGE_LIMIT_PLUGINS, *EVICTION_PLUGINS, *BUDGET_PLUGINS)
_BY_TYPE = {cls.type_name: cls for cls in POLICY_PLUGINS}


def resolve(ref: str, kind: type[Any], plugins: Mapping[str, object], where: str) -> Any:
    """The policy ``ref`` names: a configured plugin instance of that name, else (as upstream's
    loader does for its defaults) a fresh instance of the built-in type of that name."""
    found = plugins.get(ref)
    if found is None and ref in _BY_TYPE:
        try:
            found = _BY_TYPE[ref]()
        except (ValueError, TypeError) as e:  # a type with required parameters
            raise FlowControlConfigError(
                f"{where}: {ref!r} needs parameters ({e}): list it under plugins") from None
    if found is None:
        raise FlowControlConfigError(f"{where}: no plugin named {ref!r}")
    if not isinstance(found, kind):
        raise FlowControlConfigError(
            f"{where}: plugin {ref!r} is not a {kind.__name__} ({type(found).__name__})")
    return found
