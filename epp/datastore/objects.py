"""Raw Kubernetes objects (dicts, as YAML or the API server gives them) → typed models.

One entry point, :func:`parse_object`, validates as the CRDs' schemas do and raises
:class:`ObjectError` naming the object and the field. Any source — the manifests file or a
Kubernetes watch — calls it, so both reject the same things with the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from epp.datastore.models import (
    Criticality,
    FailureMode,
    LegacyModel,
    ModelRewrite,
    Objective,
    ObjectRef,
    Pod,
    PodCondition,
    Pool,
    PoolObject,
    RewriteRule,
    WeightedModel,
)

GROUP_V1: Final = "inference.networking.k8s.io"
GROUP_X: Final = "inference.networking.x-k8s.io"
#: llm-d-router v0.10's group for InferenceObjective and InferenceModelRewrite (GIE v1.6
#: dropped them from GROUP_X, which stays accepted as their deprecated group).
GROUP_LLMD: Final = "llm-d.ai"
LLMD_V1ALPHA2: Final = f"{GROUP_LLMD}/v1alpha2"
#: Kinds llm-d.ai serves (InferenceModel never moved: it stays in GROUP_X only).
LLMD_KINDS: Final = frozenset({"InferenceObjective", "InferenceModelRewrite"})
POOL_V1: Final = f"{GROUP_V1}/v1"
X_V1ALPHA2: Final = f"{GROUP_X}/v1alpha2"

MAX_TARGET_PORTS: Final = 8
MAX_SELECTOR_LABELS: Final = 64
MAX_REWRITE_WEIGHT: Final = 1_000_000
MAX_LEGACY_TARGETS: Final = 10
DEFAULT_NAMESPACE: Final = "default"


class ObjectError(ValueError):
    """An object that does not validate: names the object (``kind/name``) and the field."""

    def __init__(self, obj: str, field: str, message: str) -> None:
        super().__init__(f"{obj}: {field}: {message}")
        self.obj = obj
        self.field = field
        self.message = message


class _Reader:
    """Typed field access on one object, raising :class:`ObjectError` with the field path."""

    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, path: str, message: str) -> ObjectError:
        return ObjectError(self.label, path, message)

    def mapping(self, value: Any, path: str, *, required: bool = False) -> Mapping[str, Any]:
        if value is None:
            if required:
                raise self.fail(path, "is required")
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(path, f"must be a mapping, got {type(value).__name__}")
        return value

    def seq(self, value: Any, path: str, *, required: bool = False) -> list[Any]:
        if value is None:
            if required:
                raise self.fail(path, "is required")
            return []
        if not isinstance(value, list):
            raise self.fail(path, f"must be a list, got {type(value).__name__}")
        return value

    def string(self, value: Any, path: str, *, required: bool = False) -> str:
        if value is None:
            if required:
                raise self.fail(path, "is required")
            return ""
        if not isinstance(value, str):
            raise self.fail(path, f"must be a string, got {type(value).__name__}")
        if required and not value:
            raise self.fail(path, "must not be empty")
        return value

    def integer(
        self, value: Any, path: str, *, lo: int | None = None, hi: int | None = None
    ) -> int:
        # bool is an int in Python but never a valid number in a manifest.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be an integer, got {value!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.fail(path, f"must be between {lo} and {hi}, got {value}")
        return value

    def str_map(self, value: Any, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for k, v in self.mapping(value, path).items():
            # YAML turns `true`/`8000` into non-strings; Kubernetes would reject those.
            if not isinstance(v, str):
                raise self.fail(f"{path}.{k}", f"must be a string, got {v!r}")
            out[str(k)] = v
        return out


def object_ref(doc: Mapping[str, Any]) -> ObjectRef:
    """``kind``, namespace, name and creation time of a raw object (namespace defaults)."""
    kind = doc.get("kind")
    meta_raw = doc.get("metadata")
    meta: Mapping[str, Any] = meta_raw if isinstance(meta_raw, Mapping) else {}
    name = meta.get("name")
    ns = meta.get("namespace")
    ts: Any = meta.get("creationTimestamp")
    ts_str = _timestamp(ts)
    return ObjectRef(
        kind=kind if isinstance(kind, str) else "<no kind>",
        namespace=ns if isinstance(ns, str) and ns else DEFAULT_NAMESPACE,
        name=name if isinstance(name, str) else "",
        creation_timestamp=ts_str,
    )


def _timestamp(value: Any) -> str:
    """A creation timestamp as a UTC ISO string, so precedence sorts chronologically.

    PyYAML turns an unquoted timestamp into a ``datetime``; the API server sends a string.
    """
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat()
    return ""


#: Kinds this module parses; anything else is ignored by sources (Services, ConfigMaps, ...).
KNOWN_KINDS: Final = frozenset(
    {"InferencePool", "InferenceObjective", "InferenceModelRewrite", "InferenceModel", "Pod"}
)


def parse_object(doc: Mapping[str, Any]) -> PoolObject | None:
    """Validate one raw object into its model; None for kinds the EPP does not use.

    Raises :class:`ObjectError` for a known kind that does not validate.
    """
    ref = object_ref(doc)
    if ref.kind not in KNOWN_KINDS:
        return None
    r = _Reader(str(ref))
    if not ref.name:
        raise r.fail("metadata.name", "is required")
    api = r.string(doc.get("apiVersion"), "apiVersion", required=True)
    if ref.kind == "Pod":
        return _pod(doc, ref, r)
    spec = r.mapping(doc.get("spec"), "spec", required=True)
    if ref.kind == "InferencePool":
        if api == POOL_V1:
            return _pool_v1(spec, ref, r)
        if api == X_V1ALPHA2:
            return _pool_v1alpha2(spec, ref, r)
        raise r.fail("apiVersion", f"must be {POOL_V1} or {X_V1ALPHA2}, got {api!r}")
    if ref.kind in LLMD_KINDS:
        if api not in (LLMD_V1ALPHA2, X_V1ALPHA2):
            raise r.fail("apiVersion", f"must be {LLMD_V1ALPHA2} or (deprecated) {X_V1ALPHA2}, "
                                       f"got {api!r}")
    elif not api.startswith(GROUP_X + "/"):
        raise r.fail("apiVersion", f"must be in group {GROUP_X}, got {api!r}")
    pool_name = _pool_ref(spec, r)
    if ref.kind == "InferenceObjective":
        prio = spec.get("priority")
        priority = 0 if prio is None else r.integer(prio, "spec.priority")
        return Objective(ref=ref, pool_name=pool_name, priority=priority)
    if ref.kind == "InferenceModelRewrite":
        return _rewrite(spec, ref, pool_name, r)
    return _legacy_model(spec, ref, pool_name, r)


def _pool_ref(spec: Mapping[str, Any], r: _Reader) -> str:
    ref = r.mapping(spec.get("poolRef"), "spec.poolRef", required=True)
    return r.string(ref.get("name"), "spec.poolRef.name", required=True)


def _selector(value: Any, path: str, r: _Reader) -> dict[str, str]:
    sel = r.str_map(value, path)
    if not 1 <= len(sel) <= MAX_SELECTOR_LABELS:
        raise r.fail(path, f"must hold 1 to {MAX_SELECTOR_LABELS} labels, got {len(sel)}")
    return sel


def _failure_mode(value: Any, path: str, r: _Reader) -> FailureMode:
    if value is None:
        return FailureMode.FAIL_CLOSE
    try:
        return FailureMode(value)
    except ValueError:
        raise r.fail(path, f"must be FailOpen or FailClose, got {value!r}") from None


def _pool_v1(spec: Mapping[str, Any], ref: ObjectRef, r: _Reader) -> Pool:
    sel = r.mapping(spec.get("selector"), "spec.selector", required=True)
    selector = _selector(sel.get("matchLabels"), "spec.selector.matchLabels", r)
    ports_raw = r.seq(spec.get("targetPorts"), "spec.targetPorts", required=True)
    if not 1 <= len(ports_raw) <= MAX_TARGET_PORTS:
        raise r.fail(
            "spec.targetPorts", f"must hold 1 to {MAX_TARGET_PORTS} ports, got {len(ports_raw)}"
        )
    ports: list[int] = []
    for i, p in enumerate(ports_raw):
        path = f"spec.targetPorts[{i}].number"
        num = r.integer(r.mapping(p, f"spec.targetPorts[{i}]").get("number"), path, lo=1, hi=65535)
        if num in ports:
            raise r.fail(path, f"port {num} is listed twice")
        ports.append(num)
    proto = r.string(spec.get("appProtocol"), "spec.appProtocol") or "http"
    if proto not in ("http", "kubernetes.io/h2c"):
        raise r.fail("spec.appProtocol", f"must be http or kubernetes.io/h2c, got {proto!r}")
    epr = r.mapping(spec.get("endpointPickerRef"), "spec.endpointPickerRef")
    port_obj = r.mapping(epr.get("port"), "spec.endpointPickerRef.port")
    picker_port = (
        r.integer(port_obj["number"], "spec.endpointPickerRef.port.number", lo=1, hi=65535)
        if "number" in port_obj
        else None
    )
    return Pool(
        ref=ref,
        api_version=POOL_V1,
        selector=selector,
        target_ports=tuple(ports),
        app_protocol=proto,
        picker_name=r.string(epr.get("name"), "spec.endpointPickerRef.name"),
        picker_port=picker_port,
        failure_mode=_failure_mode(
            epr.get("failureMode"), "spec.endpointPickerRef.failureMode", r
        ),
    )


def _pool_v1alpha2(spec: Mapping[str, Any], ref: ObjectRef, r: _Reader) -> Pool:
    selector = _selector(spec.get("selector"), "spec.selector", r)
    port = r.integer(spec.get("targetPortNumber"), "spec.targetPortNumber", lo=1, hi=65535)
    ext = r.mapping(spec.get("extensionRef"), "spec.extensionRef")
    return Pool(
        ref=ref,
        api_version=X_V1ALPHA2,
        selector=selector,
        target_ports=(port,),
        picker_name=r.string(ext.get("name"), "spec.extensionRef.name"),
        failure_mode=_failure_mode(ext.get("failureMode"), "spec.extensionRef.failureMode", r),
    )


def _pod(doc: Mapping[str, Any], ref: ObjectRef, r: _Reader) -> Pod:
    meta = r.mapping(doc.get("metadata"), "metadata")
    status = r.mapping(doc.get("status"), "status")
    conds_raw = status.get("conditions")
    conditions: tuple[PodCondition, ...] | None = None
    if conds_raw is not None:
        conditions = tuple(
            PodCondition(
                type=r.string(r.mapping(c, f"status.conditions[{i}]").get("type"),
                              f"status.conditions[{i}].type"),
                status=str(c.get("status", "")),
            )
            for i, c in enumerate(r.seq(conds_raw, "status.conditions"))
        )
    return Pod(
        ref=ref,
        labels=r.str_map(meta.get("labels"), "metadata.labels"),
        annotations=r.str_map(meta.get("annotations"), "metadata.annotations"),
        pod_ip=r.string(status.get("podIP"), "status.podIP"),
        conditions=conditions,
        deleting=meta.get("deletionTimestamp") is not None,
    )


def _weighted(
    raw: Any, path: str, model_key: str, r: _Reader, *, max_items: int | None = None
) -> tuple[WeightedModel, ...]:
    items = r.seq(raw, path)
    if max_items is not None and len(items) > max_items:
        raise r.fail(path, f"must hold at most {max_items} entries, got {len(items)}")
    out: list[WeightedModel] = []
    weighted = 0
    for i, t in enumerate(items):
        t = r.mapping(t, f"{path}[{i}]")
        model = r.string(t.get(model_key), f"{path}[{i}].{model_key}", required=True)
        w = t.get("weight")
        if w is None:
            out.append(WeightedModel(model, 1))
            continue
        weighted += 1
        out.append(WeightedModel(model, r.integer(w, f"{path}[{i}].weight", lo=1,
                                                  hi=MAX_REWRITE_WEIGHT)))
    if 0 < weighted < len(out):
        raise r.fail(path, "weights must be set on all targets or on none")
    return tuple(out)


def _rewrite(spec: Mapping[str, Any], ref: ObjectRef, pool: str, r: _Reader) -> ModelRewrite:
    rules: list[RewriteRule] = []
    for i, rule in enumerate(r.seq(spec.get("rules"), "spec.rules", required=True)):
        base = f"spec.rules[{i}]"
        rule = r.mapping(rule, base)
        matches: list[str] = []
        for j, m in enumerate(r.seq(rule.get("matches"), f"{base}.matches")):
            mpath = f"{base}.matches[{j}].model"
            model = r.mapping(r.mapping(m, f"{base}.matches[{j}]").get("model"), mpath,
                              required=True)
            mtype = model.get("type", "Exact")
            if mtype != "Exact":
                raise r.fail(f"{mpath}.type", f"only Exact is supported, got {mtype!r}")
            matches.append(r.string(model.get("value"), f"{mpath}.value", required=True))
        targets = _weighted(rule.get("targets"), f"{base}.targets", "modelRewrite", r)
        if not targets:
            raise r.fail(f"{base}.targets", "must hold at least one target")
        rules.append(RewriteRule(matches=tuple(matches), targets=targets))
    return ModelRewrite(ref=ref, pool_name=pool, rules=tuple(rules))


def _legacy_model(spec: Mapping[str, Any], ref: ObjectRef, pool: str, r: _Reader) -> LegacyModel:
    crit_raw = spec.get("criticality")
    try:
        crit = Criticality.STANDARD if crit_raw is None else Criticality(crit_raw)
    except ValueError:
        raise r.fail(
            "spec.criticality", f"must be Critical, Standard or Sheddable, got {crit_raw!r}"
        ) from None
    return LegacyModel(
        ref=ref,
        pool_name=pool,
        model_name=r.string(spec.get("modelName"), "spec.modelName", required=True),
        criticality=crit,
        targets=_weighted(spec.get("targetModels"), "spec.targetModels", "name", r,
                          max_items=MAX_LEGACY_TARGETS),
    )
