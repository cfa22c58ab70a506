"""Raw Kubernetes objects as the API server stores them, for the tests to apply."""

from __future__ import annotations

from typing import Any

POOL_API = "inference.networking.k8s.io/v1"
X_API = "inference.networking.x-k8s.io/v1alpha2"
LLMD_API = "llm-d.ai/v1alpha2"
NS = "llm"


def pool(name: str = "pool-a", *, selector: dict[str, str] | None = None,
         ports: tuple[int, ...] = (8000,), namespace: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": POOL_API, "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": selector or {"app": "vllm"}},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}},
        },
    }


def pod(name: str, ip: str, *, labels: dict[str, str] | None = None, ready: bool = True,
        namespace: str = NS, deleting: bool = False,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {"app": "vllm"} if labels is None else labels}
    if annotations:
        meta["annotations"] = annotations
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False"}]},
    }


def objective(name: str, priority: int | Any, *, pool_name: str = "pool-a",
              namespace: str = NS, api: str = X_API) -> dict[str, Any]:
    return {
        "apiVersion": api, "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"priority": priority, "poolRef": {"name": pool_name}},
    }


def rewrite(name: str, model: str, target: str, *, pool_name: str = "pool-a",
            namespace: str = NS, api: str = X_API) -> dict[str, Any]:
    return {
        "apiVersion": api, "kind": "InferenceModelRewrite",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"poolRef": {"name": pool_name}, "rules": [{
            "matches": [{"model": {"type": "Exact", "value": model}}],
            "targets": [{"modelRewrite": target}]}]},
    }


def configmap(name: str, data: dict[str, str], *, managed: bool = True,
              namespace: str = NS) -> dict[str, Any]:
    labels = {"inference.networking.k8s.io/bbr-managed": "true"} if managed else {}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "data": data}
