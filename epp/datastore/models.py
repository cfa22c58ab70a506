"""Typed, immutable models of the objects an EPP serves from.

Both API generations of each kind are normalised into one model here, so nothing downstream
knows whether a pool came from ``inference.networking.k8s.io/v1`` or the legacy ``v1alpha2``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

#: Pod label naming the engine behind an endpoint (picks the metrics dialect).
ENGINE_TYPE_LABEL: Final = "inference.networking.k8s.io/engine-type"
#: Pod annotation narrowing which of the pool's target ports are served by this pod.
ACTIVE_PORTS_ANNOTATION: Final = "inference.networking.k8s.io/active-ports"


class EngineType(enum.Enum):
    """The model server behind an endpoint; decides how its ``/metrics`` are read."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM_SERVE = "trtllm-serve"
    TRITON_TRTLLM = "triton-tensorrt-llm"


class FailureMode(enum.Enum):
    """What the proxy does when the EPP is unreachable."""

    FAIL_OPEN = "FailOpen"
    FAIL_CLOSE = "FailClose"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Identity of a Kubernetes object: used in error messages and for precedence."""

    kind: str
    namespace: str
    name: str
    #: RFC 3339 string as Kubernetes writes it; sorts chronologically. Empty when unknown.
    creation_timestamp: str = ""

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class Pool:
    """An InferencePool (v1 or legacy v1alpha2), normalised."""

    ref: ObjectRef
    api_version: str
    selector: dict[str, str]
    target_ports: tuple[int, ...]
    app_protocol: str = "http"
    picker_name: str = ""
    picker_port: int | None = None
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE

    @property
    def name(self) -> str:
        """The pool's object name."""
        return self.ref.name

    @property
    def namespace(self) -> str:
        """The pool's namespace."""
        return self.ref.namespace

    def selects(self, labels: dict[str, str]) -> bool:
        """True when every selector label is present in ``labels`` with the same value."""
        return all(labels.get(k) == v for k, v in self.selector.items())


@dataclass(frozen=True, slots=True)
class PodCondition:
    """One entry of ``status.conditions``."""

    type: str
    status: str


@dataclass(frozen=True, slots=True)
class Pod:
    """The parts of a Pod the EPP needs."""

    ref: ObjectRef
    labels: dict[str, str]
    annotations: dict[str, str]
    pod_ip: str
    #: None when ``status.conditions`` is absent (a manifests-file pod: counts as Ready).
    conditions: tuple[PodCondition, ...] | None
    deleting: bool = False
    #: ``status.hostIP``: the node's address ("" when not reported)
    host_ip: str = ""

    @property
    def name(self) -> str:
        """The pod's object name."""
        return self.ref.name

    @property
    def ready(self) -> bool:
        """Ready=True, or no conditions at all (manifests files rarely write a status)."""
        if self.conditions is None:
            return True
        return any(c.type == "Ready" and c.status == "True" for c in self.conditions)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One servable address: a ready pod x one of the pool's target ports."""

    name: str
    pod_name: str
    namespace: str
    address: str
    port: int
    rank: int
    labels: dict[str, str]
    engine: EngineType = EngineType.VLLM
    #: the node's address (the pod's ``status.hostIP``; "" when unknown): where node-level
    #: exporters (DCGM as a DaemonSet) answer
    host_ip: str = ""
    #: ``ip:port``; identifies the endpoint everywhere (headers, metrics, in-flight counters).
    key: str = field(default="")

    def __post_init__(self) -> None:
        if not self.key:
            # IPv6 addresses need brackets so ``host:port`` stays unambiguous.
            host = f"[{self.address}]" if ":" in self.address else self.address
            object.__setattr__(self, "key", f"{host}:{self.port}")


@dataclass(frozen=True, slots=True)
class Objective:
    """An InferenceObjective: a named priority, chosen by ``x-gateway-inference-objective``."""

    ref: ObjectRef
    pool_name: str
    priority: int = 0

    @property
    def name(self) -> str:
        """The objective's object name (what the request header names)."""
        return self.ref.name

    @property
    def sheddable(self) -> bool:
        """Negative priority: shed first under saturation."""
        return self.priority < 0


@dataclass(frozen=True, slots=True)
class WeightedModel:
    """A rewrite target: the model name sent upstream and its relative weight."""

    model: str
    weight: int = 1


@dataclass(frozen=True, slots=True)
class RewriteRule:
    """One rule of an InferenceModelRewrite; ``matches`` empty means it matches every model."""

    matches: tuple[str, ...]
    targets: tuple[WeightedModel, ...]

    @property
    def matches_all(self) -> bool:
        """A rule without matches applies to any model the client sends."""
        return not self.matches


@dataclass(frozen=True, slots=True)
class ModelRewrite:
    """An InferenceModelRewrite: rewrites the client's model to weighted targets."""

    ref: ObjectRef
    pool_name: str
    rules: tuple[RewriteRule, ...]


class Criticality(enum.Enum):
    """Legacy InferenceModel criticality (removed upstream in v1.0)."""

    CRITICAL = "Critical"
    STANDARD = "Standard"
    SHEDDABLE = "Sheddable"

    @property
    def priority(self) -> int:
        """Mapped onto InferenceObjective priorities: Critical 1, Standard 0, Sheddable -1.

        Standard is 0 because that is an unset objective priority (the same default);
        Critical sits above it and Sheddable below zero, which is what "sheddable" means.
        """
        return _CRITICALITY_PRIORITY[self]


_CRITICALITY_PRIORITY: Final = {
    Criticality.CRITICAL: 1,
    Criticality.STANDARD: 0,
    Criticality.SHEDDABLE: -1,
}


@dataclass(frozen=True, slots=True)
class LegacyModel:
    """A legacy InferenceModel: a served model name, its criticality and weighted targets."""

    ref: ObjectRef
    pool_name: str
    model_name: str
    criticality: Criticality = Criticality.STANDARD
    targets: tuple[WeightedModel, ...] = ()

    @property
    def priority(self) -> int:
        """The criticality as an objective priority."""
        return self.criticality.priority


#: Every object kind the datastore understands, as parsed by :mod:`epp.datastore.objects`.
PoolObject = Pool | Pod | Objective | ModelRewrite | LegacyModel
