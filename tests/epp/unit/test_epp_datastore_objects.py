"""Validation of raw objects: errors name the object and the field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from epp.datastore import ObjectError, Pool, SnapshotError, build_snapshot, parse_object

Raw = Callable[..., dict[str, Any]]


def _error(doc: dict[str, Any]) -> ObjectError:
    with pytest.raises(ObjectError) as info:
        parse_object(doc)
    return info.value


def test_more_than_eight_target_ports_is_rejected(raw_pool: Raw) -> None:
    err = _error(raw_pool(ports=tuple(range(8000, 8009))))
    assert (err.obj, err.field) == ("InferencePool/pool", "spec.targetPorts")


def test_port_out_of_range_names_the_port_field(raw_pool: Raw) -> None:
    err = _error(raw_pool(ports=(8000, 70000)))
    assert err.field == "spec.targetPorts[1].number"


def test_duplicate_port_is_rejected(raw_pool: Raw) -> None:
    assert _error(raw_pool(ports=(8000, 8000))).field == "spec.targetPorts[1].number"


def test_bad_failure_mode_is_rejected(raw_pool: Raw) -> None:
    doc = raw_pool(endpointPickerRef={"name": "epp", "failureMode": "Sometimes"})
    assert _error(doc).field == "spec.endpointPickerRef.failureMode"


def test_missing_selector_is_rejected(raw_pool: Raw) -> None:
    doc = raw_pool()
    del doc["spec"]["selector"]
    assert _error(doc).field == "spec.selector"


def test_default_failure_mode_is_fail_close(raw_pool: Raw) -> None:
    pool = parse_object(raw_pool())
    assert isinstance(pool, Pool) and pool.failure_mode.value == "FailClose"


def test_rewrite_weight_out_of_range_names_the_target() -> None:
    err = _error({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModelRewrite",
        "metadata": {"name": "rw"},
        "spec": {"poolRef": {"name": "pool"}, "rules": [
            {"targets": [{"modelRewrite": "a", "weight": 0}]}]},
    })
    assert (err.obj, err.field) == ("InferenceModelRewrite/rw", "spec.rules[0].targets[0].weight")


def test_legacy_model_with_some_weights_is_rejected() -> None:
    err = _error({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel",
        "metadata": {"name": "m"},
        "spec": {"modelName": "m", "poolRef": {"name": "pool"},
                 "targetModels": [{"name": "a", "weight": 1}, {"name": "b"}]},
    })
    assert err.field == "spec.targetModels"


def test_legacy_model_with_eleven_targets_is_rejected() -> None:
    err = _error({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel",
        "metadata": {"name": "m"},
        "spec": {"modelName": "m", "poolRef": {"name": "pool"},
                 "targetModels": [{"name": f"t{i}"} for i in range(11)]},
    })
    assert err.field == "spec.targetModels"


def test_objective_priority_must_be_an_integer() -> None:
    err = _error({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
        "metadata": {"name": "o"}, "spec": {"poolRef": {"name": "pool"}, "priority": "high"},
    })
    assert err.field == "spec.priority"


def test_unknown_kind_is_ignored() -> None:
    assert parse_object({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}) is None


def test_two_pools_without_a_name_is_an_error(raw_pool: Raw) -> None:
    pools = [parse_object(raw_pool("a")), parse_object(raw_pool("b"))]
    with pytest.raises(SnapshotError, match="several InferencePools"):
        build_snapshot([p for p in pools if p], pool_name=None, pool_namespace="default")


def test_named_pool_is_selected_among_several(raw_pool: Raw) -> None:
    pools = [parse_object(raw_pool("a")), parse_object(raw_pool("b"))]
    snap = build_snapshot([p for p in pools if p], pool_name="b", pool_namespace="default")
    assert snap.pool is not None and snap.pool.name == "b"


def test_missing_named_pool_is_an_error(raw_pool: Raw) -> None:
    pools = [parse_object(raw_pool("a"))]
    with pytest.raises(SnapshotError, match="default/x not found"):
        build_snapshot([p for p in pools if p], pool_name="x", pool_namespace="default")


@pytest.mark.parametrize("api", ["llm-d.ai/v1alpha2", "inference.networking.x-k8s.io/v1alpha2"])
def test_objective_and_rewrite_load_from_llm_d_ai_and_the_deprecated_group(api: str) -> None:
    objective = parse_object({"apiVersion": api, "kind": "InferenceObjective",
                              "metadata": {"name": "o"},
                              "spec": {"priority": 2, "poolRef": {"name": "pool"}}})
    rewrite = parse_object({"apiVersion": api, "kind": "InferenceModelRewrite",
                            "metadata": {"name": "rw"}, "spec": {"poolRef": {"name": "pool"},
                                                                 "rules": [{"targets": [
                                                                     {"modelRewrite": "a"}]}]}})
    assert objective is not None and rewrite is not None


@pytest.mark.parametrize(("api", "kind"), [("llm-d.ai/v1alpha1", "InferenceObjective"),
                                           ("llm-d.ai/v1alpha2", "InferenceModel")])
def test_other_llm_d_ai_versions_and_kinds_are_refused(api: str, kind: str) -> None:
    err = _error({"apiVersion": api, "kind": kind, "metadata": {"name": "x"},
                  "spec": {"poolRef": {"name": "pool"}, "modelName": "m"}})
    assert err.field == "apiVersion"


def test_a_gie_v1_6_pool_without_endpoint_picker_ref_loads(raw_pool: Raw) -> None:
    doc = raw_pool()
    doc["spec"].pop("endpointPickerRef", None)
    pool = parse_object(doc)
    assert isinstance(pool, Pool) and pool.picker_name == "" and pool.picker_port is None
