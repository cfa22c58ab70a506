"""Pods x target ports -> endpoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epp.datastore import EngineType, Pool, build_snapshot, parse_object

Raw = Callable[..., dict[str, Any]]


def _endpoints(pool: dict[str, Any], *pods: dict[str, Any]) -> list[str]:
    objs = [parse_object(o) for o in (pool, *pods)]
    snap = build_snapshot([o for o in objs if o is not None], pool_name=None,
                          pool_namespace="default")
    return [e.name for e in snap.endpoints]


def test_ready_pod_becomes_one_endpoint_per_target_port(raw_pool: Raw, raw_pod: Raw) -> None:
    assert _endpoints(raw_pool(ports=(8000, 8001)), raw_pod("a")) == ["a-rank-0", "a-rank-1"]


def test_endpoint_key_is_ip_and_port(raw_pool: Raw, raw_pod: Raw) -> None:
    objs = [parse_object(raw_pool(ports=(8000, 8001))), parse_object(raw_pod("a", "10.1.2.3"))]
    snap = build_snapshot([o for o in objs if o], pool_name=None, pool_namespace="default")
    assert [e.key for e in snap.endpoints] == ["10.1.2.3:8000", "10.1.2.3:8001"]


def test_not_ready_pod_is_skipped(raw_pool: Raw, raw_pod: Raw) -> None:
    assert _endpoints(raw_pool(), raw_pod("a", ready=False)) == []


def test_pod_without_conditions_counts_as_ready(raw_pool: Raw, raw_pod: Raw) -> None:
    assert _endpoints(raw_pool(), raw_pod("a", ready=None)) == ["a-rank-0"]


def test_terminating_pod_is_skipped(raw_pool: Raw, raw_pod: Raw) -> None:
    assert _endpoints(raw_pool(), raw_pod("a", deleting=True)) == []


def test_pod_not_matching_selector_is_skipped(raw_pool: Raw, raw_pod: Raw) -> None:
    assert _endpoints(raw_pool(), raw_pod("a", labels={"app": "other"})) == []


def test_pod_without_ip_is_skipped(raw_pool: Raw, raw_pod: Raw) -> None:
    assert _endpoints(raw_pool(), raw_pod("a", ip=None)) == []


def test_pod_in_another_namespace_is_skipped(raw_pool: Raw, raw_pod: Raw) -> None:
    assert _endpoints(raw_pool(), raw_pod("a", namespace="elsewhere")) == []


def test_active_ports_annotation_narrows_ports_and_keeps_rank(raw_pool: Raw, raw_pod: Raw) -> None:
    p = raw_pod("a", annotations={"inference.networking.k8s.io/active-ports": "8001, 8002"})
    assert _endpoints(raw_pool(ports=(8000, 8001, 8002)), p) == ["a-rank-1", "a-rank-2"]


def test_engine_type_comes_from_pod_label(raw_pool: Raw, raw_pod: Raw) -> None:
    labels = {"app": "vllm", "inference.networking.k8s.io/engine-type": "sglang"}
    objs = [parse_object(raw_pool()), parse_object(raw_pod("a", labels=labels))]
    snap = build_snapshot([o for o in objs if o], pool_name=None, pool_namespace="default")
    assert snap.endpoints[0].engine is EngineType.SGLANG


def test_engine_type_defaults_to_vllm(raw_pool: Raw, raw_pod: Raw) -> None:
    objs = [parse_object(raw_pool()), parse_object(raw_pod("a"))]
    snap = build_snapshot([o for o in objs if o], pool_name=None, pool_namespace="default")
    assert snap.endpoints[0].engine is EngineType.VLLM


def test_legacy_pool_normalises_to_the_same_model() -> None:
    legacy = parse_object({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"selector": {"app": "vllm"}, "targetPortNumber": 8000,
                 "extensionRef": {"name": "epp", "failureMode": "FailOpen"}},
    })
    assert isinstance(legacy, Pool)
    assert (legacy.selector, legacy.target_ports, legacy.failure_mode.value) == (
        {"app": "vllm"}, (8000,), "FailOpen")
