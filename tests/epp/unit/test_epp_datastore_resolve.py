"""Target-model resolution: rewrite header, InferenceModelRewrite precedence, legacy models,
objective priorities."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from epp.datastore import PrioritySource, Snapshot, build_snapshot, parse_object

Raw = Callable[..., dict[str, Any]]
X = "inference.networking.x-k8s.io/v1alpha2"


def rewrite(name: str, rules: list[dict[str, Any]], created: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if created:
        meta["creationTimestamp"] = created
    return {"apiVersion": X, "kind": "InferenceModelRewrite", "metadata": meta,
            "spec": {"poolRef": {"name": "pool"}, "rules": rules}}


def rule(target: str | list[tuple[str, int]], match: str | None = None) -> dict[str, Any]:
    targets = ([{"modelRewrite": target}] if isinstance(target, str)
               else [{"modelRewrite": m, "weight": w} for m, w in target])
    r: dict[str, Any] = {"targets": targets}
    if match is not None:
        r["matches"] = [{"model": {"type": "Exact", "value": match}}]
    return r


def snapshot(raw_pool: Raw, *docs: dict[str, Any]) -> Snapshot:
    objs = [parse_object(d) for d in (raw_pool(), *docs)]
    return build_snapshot([o for o in objs if o], pool_name=None, pool_namespace="default")


RNG = random.Random(0)


def test_exact_rule_beats_match_all_rule(raw_pool: Raw) -> None:
    snap = snapshot(raw_pool, rewrite("older", [rule("catch-all")], "2024-01-01T00:00:00Z"),
                    rewrite("newer", [rule("exact", match="m")], "2025-01-01T00:00:00Z"))
    assert snap.resolve("m", rng=RNG).target_model == "exact"


def test_match_all_rule_applies_to_unlisted_models(raw_pool: Raw) -> None:
    snap = snapshot(raw_pool, rewrite("rw", [rule("exact", match="m"), rule("catch-all")]))
    assert snap.resolve("other", rng=RNG).target_model == "catch-all"


def test_oldest_object_wins_between_exact_rules(raw_pool: Raw) -> None:
    snap = snapshot(raw_pool, rewrite("b-new", [rule("new", match="m")], "2025-01-01T00:00:00Z"),
                    rewrite("a-old", [rule("old", match="m")], "2024-01-01T00:00:00Z"))
    assert snap.resolve("m", rng=RNG).target_model == "old"


def test_name_breaks_creation_time_ties(raw_pool: Raw) -> None:
    ts = "2024-01-01T00:00:00Z"
    snap = snapshot(raw_pool, rewrite("zz", [rule("z", match="m")], ts),
                    rewrite("aa", [rule("a", match="m")], ts))
    assert snap.resolve("m", rng=RNG).target_model == "a"


def test_first_rule_wins_within_an_object(raw_pool: Raw) -> None:
    snap = snapshot(raw_pool, rewrite("rw", [rule("first", match="m"), rule("second", match="m")]))
    assert snap.resolve("m", rng=RNG).target_model == "first"


def test_rewrite_header_forces_the_target(raw_pool: Raw) -> None:
    snap = snapshot(raw_pool, rewrite("rw", [rule("exact", match="m")]))
    assert snap.resolve("m", rng=RNG, rewrite_header="forced").target_model == "forced"


def test_unknown_model_passes_through_at_priority_zero(raw_pool: Raw) -> None:
    res = snapshot(raw_pool).resolve("m", rng=RNG)
    assert (res.target_model, res.priority, res.priority_source) == ("m", 0,
                                                                     PrioritySource.DEFAULT)


def test_weighted_split_follows_the_weights(raw_pool: Raw) -> None:
    snap = snapshot(raw_pool, rewrite("rw", [rule([("a", 80), ("b", 20)], match="m")]))
    rng = random.Random(42)
    counts = Counter(snap.resolve("m", rng=rng).target_model for _ in range(10_000))
    assert 0.77 < counts["a"] / 10_000 < 0.83


def test_objective_header_sets_priority(raw_pool: Raw) -> None:
    obj = {"apiVersion": X, "kind": "InferenceObjective", "metadata": {"name": "batch"},
           "spec": {"poolRef": {"name": "pool"}, "priority": -5}}
    res = snapshot(raw_pool, obj).resolve("m", rng=RNG, objective_header="batch")
    assert (res.priority, res.priority_source, res.objective) == (
        -5, PrioritySource.OBJECTIVE, "batch")


def test_objective_of_another_pool_is_ignored(raw_pool: Raw) -> None:
    obj = {"apiVersion": X, "kind": "InferenceObjective", "metadata": {"name": "batch"},
           "spec": {"poolRef": {"name": "other"}, "priority": -5}}
    res = snapshot(raw_pool, obj).resolve("m", rng=RNG, objective_header="batch")
    assert res.priority_source is PrioritySource.DEFAULT


def legacy(criticality: str | None, targets: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = {"modelName": "m", "poolRef": {"name": "pool"},
                            "targetModels": targets}
    if criticality:
        spec["criticality"] = criticality
    return {"apiVersion": X, "kind": "InferenceModel", "metadata": {"name": "m"}, "spec": spec}


def test_legacy_model_splits_over_weighted_targets(raw_pool: Raw) -> None:
    snap = snapshot(raw_pool, legacy(None, [{"name": "a", "weight": 50},
                                            {"name": "b", "weight": 50}]))
    rng = random.Random(7)
    seen = {snap.resolve("m", rng=rng).target_model for _ in range(200)}
    assert seen == {"a", "b"}


def test_legacy_sheddable_model_gets_negative_priority(raw_pool: Raw) -> None:
    res = snapshot(raw_pool, legacy("Sheddable", [])).resolve("m", rng=RNG)
    assert (res.priority, res.priority_source) == (-1, PrioritySource.LEGACY_MODEL)


def test_legacy_model_without_criticality_is_standard_priority_zero(raw_pool: Raw) -> None:
    assert snapshot(raw_pool, legacy(None, [])).resolve("m", rng=RNG).priority == 0


def test_legacy_critical_model_gets_priority_one(raw_pool: Raw) -> None:
    assert snapshot(raw_pool, legacy("Critical", [])).resolve("m", rng=RNG).priority == 1
