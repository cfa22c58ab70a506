"""Builders shared by the EPP unit tests (real objects, no mocks)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from epp.datastore import Endpoint, EndpointMetrics, EndpointView, EngineType, LoraInfo

ViewFactory = Callable[..., EndpointView]


def build_view(
    i: int = 0,
    *,
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.0,
    lora: LoraInfo | None = None,
    labels: dict[str, str] | None = None,
    num_gpu_blocks: int | None = None,
    updated_at: float | None = None,
    engine: EngineType = EngineType.VLLM,
) -> EndpointView:
    """An endpoint ``10.0.0.<i>:8000`` with one scrape installed."""
    ep = Endpoint(
        name=f"pod-{i}-rank-0",
        pod_name=f"pod-{i}",
        namespace="default",
        address=f"10.0.0.{i}",
        port=8000,
        rank=0,
        labels=labels or {"app": "vllm"},
        engine=engine,
    )
    view = EndpointView(ep)
    view.begin_scrape()
    view.apply_scrape(
        EndpointMetrics(
            waiting=waiting,
            running=running,
            kv_usage=kv,
            lora=lora,
            num_gpu_blocks=num_gpu_blocks,
            updated_at=time.monotonic() if updated_at is None else updated_at,
        )
    )
    return view


@pytest.fixture
def make_view() -> ViewFactory:
    """Factory: ``make_view(i, waiting=..., kv=...)`` -> a scraped EndpointView."""
    return build_view


def pod(
    name: str,
    ip: str | None = "10.0.0.1",
    *,
    labels: dict[str, str] | None = None,
    ready: bool | None = True,
    deleting: bool = False,
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A raw Pod object as YAML would give it (``ready=None``: no conditions at all)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": labels if labels is not None else {"app": "vllm"}}
    if annotations:
        meta["annotations"] = annotations
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    status: dict[str, Any] = {}
    if ip:
        status["podIP"] = ip
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def pool_v1(name: str = "pool", ports: tuple[int, ...] = (8000,), **spec: Any) -> dict[str, Any]:
    """A raw v1 InferencePool selecting ``app=vllm``."""
    body: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "vllm"}},
        "targetPorts": [{"number": p} for p in ports],
        "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
    }
    body.update(spec)
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": "default"}, "spec": body}


@pytest.fixture
def raw_pod() -> Callable[..., dict[str, Any]]:
    """Factory for raw Pod dicts (see :func:`pod`)."""
    return pod


@pytest.fixture
def raw_pool() -> Callable[..., dict[str, Any]]:
    """Factory for raw v1 InferencePool dicts (see :func:`pool_v1`)."""
    return pool_v1
