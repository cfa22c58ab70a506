"""The immutable state an EPP serves from, and how it is built from parsed objects.

:func:`build_snapshot` is the single place that turns "the objects a source knows about"
into "what this EPP serves": it picks the pool, derives endpoints (ready pod x target port),
and indexes objectives, rewrites and legacy models for that pool. A source builds a new
snapshot on every change and hands it to :meth:`epp.datastore.Datastore.replace`.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from epp.datastore.models import (
    ACTIVE_PORTS_ANNOTATION,
    ENGINE_TYPE_LABEL,
    Endpoint,
    EngineType,
    LegacyModel,
    ModelRewrite,
    Objective,
    Pod,
    Pool,
    PoolObject,
    WeightedModel,
)

log = structlog.get_logger(__name__)


class SnapshotError(ValueError):
    """The objects do not describe a servable pool (none, ambiguous, or not the named one)."""


class PrioritySource(enum.Enum):
    """Where a request's priority came from."""

    OBJECTIVE = "objective"
    LEGACY_MODEL = "legacy-model"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class ModelResolution:
    """What a request's client model resolves to in this pool."""

    target_model: str
    priority: int
    priority_source: PrioritySource
    #: Name of the InferenceObjective that set the priority, when one did.
    objective: str | None = None
    #: True when the target differs from the client's model (a rewrite or legacy split).
    rewritten: bool = False
    #: Name of the InferenceModelRewrite whose rule chose the target, when one did.
    rewrite_name: str | None = None


def weighted_choice(targets: Sequence[WeightedModel], rng: random.Random) -> str:
    """One target's model, chosen with probability weight / Σ weights."""
    if len(targets) == 1:
        return targets[0].model
    total = sum(t.weight for t in targets)
    x = rng.random() * total
    for t in targets:
        x -= t.weight
        if x < 0:
            return t.model
    return targets[-1].model  # float rounding at the very top of the range


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything about one pool at one moment; replaced whole, never mutated."""

    pool: Pool | None = None
    endpoints: tuple[Endpoint, ...] = ()
    objectives: Mapping[str, Objective] = field(default_factory=dict)
    #: Rewrites in precedence order (oldest object first, then name).
    rewrites: tuple[ModelRewrite, ...] = ()
    #: Legacy InferenceModels by ``modelName``.
    legacy_models: Mapping[str, LegacyModel] = field(default_factory=dict)
    #: Exact-match rewrite targets by client model, precedence already applied.
    _exact: Mapping[str, tuple[WeightedModel, ...]] = field(default_factory=dict, repr=False)
    #: Targets of the winning match-all rule, if any.
    _match_all: tuple[WeightedModel, ...] = ()
    #: The InferenceModelRewrite behind each exact-match entry, and behind the match-all.
    _exact_names: Mapping[str, str] = field(default_factory=dict, repr=False)
    _match_all_name: str = ""

    def resolve(
        self,
        client_model: str,
        *,
        rng: random.Random,
        rewrite_header: str | None = None,
        objective_header: str | None = None,
    ) -> ModelResolution:
        """The target model and priority for a request.

        Target: ``x-gateway-model-name-rewrite`` when set; else an InferenceModelRewrite
        (exact rule over match-all rule, oldest object, first rule; weighted random target);
        else a legacy InferenceModel's weighted ``targetModels``; else the client's model.
        Priority: the objective named by ``x-gateway-inference-objective``; else the legacy
        model's criticality; else 0 (upstream v1 admits unknown models at priority 0).
        """
        legacy = self.legacy_models.get(client_model)
        rewrite_name = None
        if rewrite_header:
            target = rewrite_header
        else:
            targets = self._exact.get(client_model)
            if targets:
                rewrite_name = self._exact_names.get(client_model)
            elif self._match_all:
                targets, rewrite_name = self._match_all, self._match_all_name
            if targets:
                target = weighted_choice(targets, rng)
            elif legacy is not None and legacy.targets:
                target = weighted_choice(legacy.targets, rng)
            else:
                target = client_model
        rewritten = target != client_model
        if objective_header:
            obj = self.objectives.get(objective_header)
            if obj is not None:
                return ModelResolution(
                    target, obj.priority, PrioritySource.OBJECTIVE, obj.name, rewritten,
                    rewrite_name)
        if legacy is not None:
            return ModelResolution(
                target, legacy.priority, PrioritySource.LEGACY_MODEL, None, rewritten,
                rewrite_name)
        return ModelResolution(target, 0, PrioritySource.DEFAULT, None, rewritten, rewrite_name)


def endpoints_for(pool: Pool, pods: Iterable[Pod]) -> tuple[Endpoint, ...]:
    """Ready pods selected by ``pool`` x its target ports (narrowed by the active-ports
    annotation), named ``<pod>-rank-<i>`` with ``i`` the port's index in ``targetPorts``.
    """
    out: list[Endpoint] = []
    for pod in sorted(pods, key=lambda p: p.name):
        if (
            pod.deleting
            or not pod.ready
            or not pod.pod_ip
            or pod.ref.namespace != pool.namespace
            or not pool.selects(pod.labels)
        ):
            continue
        active = _active_ports(pod)
        engine = _engine(pod)
        for rank, port in enumerate(pool.target_ports):
            if active is not None and port not in active:
                continue
            out.append(
                Endpoint(
                    name=f"{pod.name}-rank-{rank}",
                    pod_name=pod.name,
                    namespace=pod.ref.namespace,
                    address=pod.pod_ip,
                    port=port,
                    rank=rank,
                    labels=pod.labels,
                    engine=engine,
                    host_ip=pod.host_ip,
                )
            )
    return tuple(out)


def _active_ports(pod: Pod) -> frozenset[int] | None:
    raw = pod.annotations.get(ACTIVE_PORTS_ANNOTATION)
    if raw is None:
        return None
    ports: set[int] = set()
    for part in raw.split(","):
        part = part.strip()
        if part.isdigit():
            ports.add(int(part))
        elif part:
            log.warning("ignoring a bad active-ports entry", pod=pod.name, value=part)
    return frozenset(ports)


def _engine(pod: Pod) -> EngineType:
    raw = pod.labels.get(ENGINE_TYPE_LABEL)
    if raw is None:
        return EngineType.VLLM
    try:
        return EngineType(raw)
    except ValueError:
        # A pod is still servable; only its metrics dialect is unknown, so assume the default.
        log.warning("unknown engine type, reading metrics as vllm", pod=pod.name, engine=raw)
        return EngineType.VLLM


def select_pool(pools: Sequence[Pool], name: str | None, namespace: str) -> Pool:
    """The pool this EPP serves: the one named (in ``namespace``), or the only one."""
    if name:
        found = [p for p in pools if p.name == name and p.namespace == namespace]
        if not found:
            have = ", ".join(f"{p.namespace}/{p.name}" for p in pools) or "none"
            raise SnapshotError(f"InferencePool {namespace}/{name} not found (have: {have})")
        # Both API versions under one name: the v1 object wins, as it is the served API.
        found.sort(key=lambda p: p.api_version != "inference.networking.k8s.io/v1")
        return found[0]
    if len(pools) == 1:
        return pools[0]
    if not pools:
        raise SnapshotError("no InferencePool found")
    names = ", ".join(f"{p.namespace}/{p.name}" for p in pools)
    raise SnapshotError(f"several InferencePools ({names}); choose one with --pool-name")


def _precedence_key(obj: ModelRewrite) -> tuple[str, str]:
    return (obj.ref.creation_timestamp, obj.ref.name)


def build_snapshot(
    objects: Iterable[PoolObject], *, pool_name: str | None, pool_namespace: str
) -> Snapshot:
    """Build the snapshot for one pool from every object a source knows about.

    Objects of other pools or namespaces are ignored. Raises :class:`SnapshotError` when the
    pool cannot be chosen.
    """
    pools: list[Pool] = []
    pods: list[Pod] = []
    objectives: list[Objective] = []
    rewrites: list[ModelRewrite] = []
    legacy: list[LegacyModel] = []
    for obj in objects:
        if isinstance(obj, Pool):
            pools.append(obj)
        elif isinstance(obj, Pod):
            pods.append(obj)
        elif isinstance(obj, Objective):
            objectives.append(obj)
        elif isinstance(obj, ModelRewrite):
            rewrites.append(obj)
        else:
            legacy.append(obj)
    pool = select_pool(pools, pool_name, pool_namespace)

    def mine(o: Objective | ModelRewrite | LegacyModel) -> bool:
        return o.pool_name == pool.name and o.ref.namespace == pool.namespace

    my_rewrites = tuple(sorted(filter(mine, rewrites), key=_precedence_key))
    exact: dict[str, tuple[WeightedModel, ...]] = {}
    exact_names: dict[str, str] = {}
    match_all: tuple[WeightedModel, ...] = ()
    match_all_name = ""
    # Walk in precedence order; the first object/rule to claim a model keeps it.
    for rw in my_rewrites:
        for rule in rw.rules:
            if rule.matches_all and not match_all:
                match_all, match_all_name = rule.targets, rw.ref.name
            for model in rule.matches:
                if model not in exact:
                    exact[model], exact_names[model] = rule.targets, rw.ref.name
    my_legacy: dict[str, LegacyModel] = {}
    for lm in sorted(filter(mine, legacy), key=lambda o: (o.ref.creation_timestamp, o.ref.name)):
        my_legacy.setdefault(lm.model_name, lm)
    return Snapshot(
        pool=pool,
        endpoints=endpoints_for(pool, pods),
        objectives={o.name: o for o in objectives if mine(o)},
        rewrites=my_rewrites,
        legacy_models=my_legacy,
        _exact=exact,
        _match_all=match_all,
        _exact_names=exact_names,
        _match_all_name=match_all_name,
    )
