"""Flow-control policies under upstream v1.5's plugin type names.

Three tiers pick the next request to dispatch (upstream's "3-tier dispatch hierarchy"):

1. priority: the highest non-empty band first; a band may go only while the pool's saturation
   is below its usage limit (``static-usage-limit-policy``), else dispatch stops there
   (head-of-line blocking, so lower bands never take what a higher one waits for);
2. fairness, between the flows (tenants) of a band: ``global-strict-fairness-policy`` (the best
   head across all flows, as if the band were one queue) or ``round-robin-fairness-policy``
   (flows in turn, sorted by fairness id, resuming after the last one served);
3. ordering, inside a flow: ``fcfs-ordering-policy`` (arrival), ``edf-ordering-policy``
   (enqueue time + TTL; no TTL sorts last) or ``slo-deadline-ordering-policy`` (arrival +
   ``x-slo-ttft-ms``; no or bad header sorts last). Ties fall back to arrival order.

None of these take parameters except the usage-limit policy (``threshold``, default 1.0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from epp.flowcontrol.config import FlowControlConfigError
from epp.flowcontrol.types import QueueItem

if TYPE_CHECKING:
    from epp.flowcontrol.queues import Band, FlowQueue

SLO_TTFT_HEADER = "x-slo-ttft-ms"


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


@runtime_checkable
class UsageLimitPolicy(Protocol):
    """Per priority (highest first), the saturation below which that band may dispatch."""

    type_name: ClassVar[str]

    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]: ...


class FCFSOrdering:
    """First come, first served: key = logical enqueue time."""

    type_name: ClassVar[str] = "fcfs-ordering-policy"

    def key(self, item: QueueItem) -> tuple[float, float]:
        return (item.enqueued_at, 0.0)


class EDFOrdering:
    """Earliest deadline first: key = enqueue time + effective TTL (∞ without a TTL)."""

    type_name: ClassVar[str] = "edf-ordering-policy"

    def key(self, item: QueueItem) -> tuple[float, float]:
        deadline = math.inf if item.deadline is None else item.deadline
        return (deadline, item.enqueued_at)


class SLODeadlineOrdering:
    """Earliest SLO deadline first: key = arrival + ``x-slo-ttft-ms`` (∞ when absent/bad)."""

    type_name: ClassVar[str] = "slo-deadline-ordering-policy"

    def key(self, item: QueueItem) -> tuple[float, float]:
        raw = item.request.headers.get(SLO_TTFT_HEADER, "").strip()
        deadline = math.inf
        if raw.isdigit():
            deadline = item.received_at + int(raw) / 1000.0
        return (deadline, item.received_at)


class GlobalStrictFairness:
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


class RoundRobinFairness:
    """Flows in turn: sorted by fairness id, starting after the one served last."""

    type_name: ClassVar[str] = "round-robin-fairness-policy"

    def new_state(self) -> _Cursor:
        return _Cursor()

    def pick(self, band: Band) -> FlowQueue | None:
        cursor: _Cursor = band.fairness_state
        ids = sorted(fid for fid, f in band.flows.items() if f.length)
        if not ids:
            cursor.last = None
            return None
        start = 0
        if cursor.last is not None:
            # The first id after the last one served (wrapping); works even if that flow is gone.
            start = next((i for i, fid in enumerate(ids) if fid > cursor.last), 0)
        chosen = ids[start]
        cursor.last = chosen
        return band.flows[chosen]


class StaticUsageLimit:
    """The same ceiling for every band: dispatch while saturation < ``threshold``."""

    type_name: ClassVar[str] = "static-usage-limit-policy"

    def __init__(self, threshold: float = 1.0) -> None:
        self.threshold = threshold

    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        return [self.threshold] * len(priorities)


def _no_params(cls: Callable[[], Any]) -> Callable[[Mapping[str, Any], str], Any]:
    def factory(params: Mapping[str, Any], where: str) -> Any:
        if params:
            raise FlowControlConfigError(
                f"{where}: {cls.type_name} takes no parameters, "  # type: ignore[attr-defined]
                f"got {', '.join(map(str, params))}")
        return cls()
    return factory


def _static_usage_limit(params: Mapping[str, Any], where: str) -> StaticUsageLimit:
    for key in params:
        if key != "threshold":
            raise FlowControlConfigError(f"{where}.{key}: unknown parameter (known: threshold)")
    threshold = params.get("threshold", 1.0)
    if (not isinstance(threshold, int | float) or isinstance(threshold, bool)
            or not math.isfinite(threshold) or threshold <= 0):
        raise FlowControlConfigError(
            f"{where}.threshold: must be a positive number, got {threshold!r}")
    return StaticUsageLimit(float(threshold))


#: Plugin type → factory(parameters, config path). The EPP's plugin registry exposes these.
POLICY_TYPES: dict[str, Callable[[Mapping[str, Any], str], Any]] = {
    FCFSOrdering.type_name: _no_params(FCFSOrdering),
    EDFOrdering.type_name: _no_params(EDFOrdering),
    SLODeadlineOrdering.type_name: _no_params(SLODeadlineOrdering),
    GlobalStrictFairness.type_name: _no_params(GlobalStrictFairness),
    RoundRobinFairness.type_name: _no_params(RoundRobinFairness),
    StaticUsageLimit.type_name: _static_usage_limit,
}


def new_policy(type_name: str, params: Mapping[str, Any] | None = None,
               where: str = "plugins") -> Any:
    """Instantiate a policy by plugin type, validating its parameters."""
    factory = POLICY_TYPES.get(type_name)
    if factory is None:
        raise FlowControlConfigError(f"{where}: unknown flow-control policy type {type_name!r}")
    return factory(params or {}, where)


def resolve(ref: str, kind: type[Any], plugins: Mapping[str, object], where: str) -> Any:
    """The policy ``ref`` names: a configured plugin instance of that name, else (as upstream's
    loader does for its defaults) a fresh instance of the built-in type of that name."""
    found = plugins.get(ref)
    if found is None and ref in POLICY_TYPES:
        found = new_policy(ref, where=where)
    if found is None:
        raise FlowControlConfigError(f"{where}: no plugin named {ref!r}")
    if not isinstance(found, kind):
        raise FlowControlConfigError(
            f"{where}: plugin {ref!r} is not a {kind.__name__} ({type(found).__name__})")
    return found
