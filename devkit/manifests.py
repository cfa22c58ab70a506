"""Manifests for a pool of loopback "pods", as the EPP's ``--manifests`` file reads them."""

from __future__ import annotations

from typing import Any


def pool_manifests(
    pool: str, pods: list[tuple[str, str]], port: int,
    extra: list[dict[str, Any]] | None = None, *, labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """An InferencePool selecting ``app: <pool>`` plus one ready Pod per (name, ip)."""
    sel = labels or {"app": pool}
    docs: list[dict[str, Any]] = [{
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": pool, "namespace": "default"},
        "spec": {"selector": {"matchLabels": sel}, "targetPorts": [{"number": port}],
                 "endpointPickerRef": {"name": f"{pool}-epp", "port": {"number": 9002}}},
    }]
    for name, ip in pods:
        docs.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": name, "namespace": "default", "labels": dict(sel)},
                     "status": {"podIP": ip}})
    return docs + list(extra or [])


def ports_pool_manifests(pool: str, ip: str, ports: list[int]) -> list[dict[str, Any]]:
    """An InferencePool with one target port per server and one ready Pod at ``ip``: several
    servers on one host, an endpoint per port (``<ip>:<port>``)."""
    docs = pool_manifests(pool, [(pool, ip)], ports[0])
    docs[0]["spec"]["targetPorts"] = [{"number": p} for p in ports]
    return docs


def write_yaml(path: Any, docs: list[dict[str, Any]]) -> None:
    """Write ``docs`` as one multi-document YAML file (atomically, for live reloads)."""
    import os

    import yaml

    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)
    os.replace(tmp, path)
