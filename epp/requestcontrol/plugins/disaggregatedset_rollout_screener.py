"""``disaggregatedset-rollout-screener`` (llm-d-router v0.10): during a DisaggregatedSet
rollout, never pair a prefill pod of one revision with a decode pod of another.

Once per request, before every scheduling profile, it keeps the candidates of one revision:
the one a ``strict`` header selector names, else one drawn among the revisions that have a
Ready pod for every required role, weighted by their Ready pods (``revisionGating.mode``).
It stamps each header selector's label of the serving endpoint on the response, so a
coordinator can send the next stage to the same revision (``strict``) or prefer the same
slice (``prefer``, with ``header-label-affinity-scorer``).

Pods are counted from this EPP's pool (its Ready endpoints, one pod once however many ports)
that match ``scope.labelSelector``; upstream watches every Pod the selector matches, which
differs only when the roles live in pools of different EPPs (a topology upstream does not
support end to end yet either).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from epp.datastore import Datastore, EndpointView
from epp.requestcontrol.plugin import Response, ResponseReceived, Screener
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest
from shared.errors import ServiceUnavailable
from shared.plugins import Handle

REVISION_LABEL = "disaggregatedset.x-k8s.io/revision"
ROLE_LABEL = "disaggregatedset.x-k8s.io/role"


def parse_selector(text: str) -> list[tuple[str, str, str | None]]:
    """A Kubernetes equality-based label selector (``k=v``, ``k==v``, ``k!=v``, ``k``,
    ``!k``, comma-separated) → (key, op, value) requirements; ValueError when malformed."""
    out: list[tuple[str, str, str | None]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError(f"scope.labelSelector: empty requirement in {text!r}")
        for op in ("!=", "==", "="):
            if op in part:
                key, value = (x.strip() for x in part.split(op, 1))
                if not key:
                    raise ValueError(f"scope.labelSelector: no key in {part!r}")
                out.append((key, "!=" if op == "!=" else "=", value))
                break
        else:
            if part.startswith("!"):
                out.append((part[1:].strip(), "!", None))
            elif " " in part or "(" in part:
                raise ValueError(f"scope.labelSelector: set-based requirement {part!r} is not "
                                 f"supported (use key=value)")
            else:
                out.append((part, "exists", None))
    return out


def selector_matches(reqs: list[tuple[str, str, str | None]], labels: dict[str, str]) -> bool:
    """True when ``labels`` satisfy every requirement."""
    for key, op, value in reqs:
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!" and key in labels:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Scope:
    """``labelSelector`` (required): the pods observed for revision coverage."""

    label_selector: str = ""


@dataclass(frozen=True, slots=True)
class HeaderSelector:
    """``name``, ``headerName``, ``labelKey``, ``mode`` (``strict`` | ``prefer``)."""

    name: str = ""
    header_name: str = ""
    label_key: str = ""
    mode: Literal["strict", "prefer"] = "prefer"

    def __post_init__(self) -> None:
        for key, value in (("name", self.name), ("headerName", self.header_name),
                           ("labelKey", self.label_key)):
            if not value.strip():
                raise ValueError(f"headerSelectors: {key} is required")


@dataclass(frozen=True, slots=True)
class RequireRoles:
    """``values``: roles that must each have a Ready pod."""

    values: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RevisionGating:
    """``mode`` (``sum`` | ``max-role`` | ``disabled``, required), ``requireRoles`` (required
    unless disabled), ``revisionLabelKey``, ``roleLabelKey``."""

    mode: Literal["sum", "max-role", "disabled", ""] = ""
    require_roles: RequireRoles = field(default_factory=RequireRoles)
    revision_label_key: str = REVISION_LABEL
    role_label_key: str = ROLE_LABEL

    def __post_init__(self) -> None:
        if not self.mode:
            raise ValueError("revisionGating.mode is required: sum, max-role or disabled")
        if self.mode != "disabled" and not self.require_roles.values:
            raise ValueError(f"revisionGating.requireRoles.values is required with mode "
                             f"{self.mode}")


@dataclass(frozen=True, slots=True)
class RolloutScreenerParameters:
    """``scope``, ``headerSelectors``, ``revisionGating`` (upstream's names)."""

    scope: Scope = field(default_factory=Scope)
    header_selectors: list[HeaderSelector] = field(default_factory=list)
    revision_gating: RevisionGating | None = None

    def __post_init__(self) -> None:
        if not self.scope.label_selector.strip():
            raise ValueError("scope.labelSelector is required")
        parse_selector(self.scope.label_selector)
        if self.revision_gating is None:
            raise ValueError("revisionGating is required (mode: disabled keeps only the "
                             "header selectors)")
        names = [s.name for s in self.header_selectors]
        if len(set(names)) != len(names):
            raise ValueError("headerSelectors: names must be unique")


class DisaggregatedSetRolloutScreener(Plugin, Screener, ResponseReceived):
    """keep = candidates whose label equals each present ``strict`` header; then, with
    gating on and no strict revision header: covered = revisions with ≥ 1 Ready pod of
    every required role (none → 503); weight(rev) = Ready pods of rev over the required roles
    (``sum``) or Ready pods of the dominant role (``max-role``: the role with most Ready pods
    over the covered revisions, ties to the first listed); one revision is drawn by weight
    and only its candidates are kept. A strict header matching nothing, or naming an
    incomplete revision, is a 503 (fail closed). The response gets each selector's header
    with the serving endpoint's label."""

    type_name = "disaggregatedset-rollout-screener"
    parameters_type = RolloutScreenerParameters
    params: RolloutScreenerParameters

    def __init__(self, name: str = "", params: Any = None, datastore: Datastore | None = None,
                 rng: random.Random | None = None) -> None:
        super().__init__(name, params)
        self.datastore = datastore
        self.rng = rng or random.Random()
        self.scope = parse_selector(self.params.scope.label_selector)
        assert self.params.revision_gating is not None
        self.gating = self.params.revision_gating

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> DisaggregatedSetRolloutScreener:
        return cls(name, params, getattr(handle, "datastore", None), handle.rng)

    def ready_pods(self, endpoints: Sequence[EndpointView]) -> dict[str, dict[str, int]]:
        """revision → role → Ready pods in scope (a pod counts once)."""
        g = self.gating
        seen: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for v in endpoints:
            labels = v.endpoint.labels
            if not selector_matches(self.scope, labels):
                continue
            rev, role = labels.get(g.revision_label_key), labels.get(g.role_label_key)
            if rev and role:
                seen[rev][role].add(f"{v.endpoint.namespace}/{v.endpoint.pod_name}")
        return {rev: {role: len(p) for role, p in roles.items()} for rev, roles in seen.items()}

    def shares(self, counts: dict[str, dict[str, int]]) -> dict[str, float]:
        """Each covered revision's weight (incomplete revisions are left out)."""
        roles = self.gating.require_roles.values
        covered = {rev: c for rev, c in counts.items() if all(c.get(r, 0) > 0 for r in roles)}
        if not covered:
            return {}
        if self.gating.mode == "sum":
            return {rev: float(sum(c.get(r, 0) for r in roles)) for rev, c in covered.items()}
        totals = [sum(c.get(r, 0) for c in covered.values()) for r in roles]
        dominant = roles[totals.index(max(totals))]  # index(): ties go to the first listed
        return {rev: float(c.get(dominant, 0)) for rev, c in covered.items()}

    def screen(self, request: LLMRequest,
               endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        g = self.gating
        kept = list(endpoints)
        strict_revision: str | None = None
        for sel in self.params.header_selectors:
            wanted = request.headers.get(sel.header_name.strip().lower(), "").strip()
            if sel.mode != "strict" or not wanted:
                continue
            kept = [v for v in kept if v.endpoint.labels.get(sel.label_key) == wanted]
            if not kept:
                raise ServiceUnavailable(f"no endpoint has {sel.label_key}={wanted} "
                                         f"({sel.header_name}, selector {sel.name})")
            if sel.label_key == g.revision_label_key:
                strict_revision = wanted
        if g.mode == "disabled":
            return kept
        pool = self.datastore.views() if self.datastore is not None else list(endpoints)
        weights = self.shares(self.ready_pods(pool))
        if strict_revision is not None:
            if strict_revision not in weights:
                raise ServiceUnavailable(f"revision {strict_revision} lacks a Ready pod for "
                                         f"one of {', '.join(g.require_roles.values)}")
            return kept
        revisions = [r for r in weights if weights[r] > 0]
        if not revisions:
            raise ServiceUnavailable("no DisaggregatedSet revision has a Ready pod for every "
                                     f"role ({', '.join(g.require_roles.values)})")
        chosen = self.rng.choices(revisions, [weights[r] for r in revisions])[0]
        kept = [v for v in kept if v.endpoint.labels.get(g.revision_label_key) == chosen]
        if not kept:
            raise ServiceUnavailable(f"no candidate of revision {chosen}")
        return kept

    def response_received(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        for sel in self.params.header_selectors:
            value = endpoint.endpoint.labels.get(sel.label_key)
            if value:
                response.set_headers[sel.header_name.strip().lower()] = value
