"""Standalone mode (``--endpoint-selector`` + ``--endpoint-target-ports``), as upstream's: no
InferencePool object; the pods matching a label selector, on the given ports, form a pool
synthesised here. Shared by the Kubernetes source and the manifests file (so it imports
neither the Kubernetes client nor YAML)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from epp.datastore import ObjectRef, Pool
from epp.datastore.objects import MAX_TARGET_PORTS, POOL_V1

#: Name of the synthesised pool in standalone mode when ``--pool-name`` is not given.
STANDALONE_POOL_NAME: Final = "standalone"

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def parse_endpoint_selector(text: str) -> dict[str, str]:
    """``app=vllm,tier=gpu`` → ``{"app": "vllm", "tier": "gpu"}``.

    Only equality requirements: the synthesised pool holds a ``matchLabels`` map, as the
    InferencePool's selector does. Raises ValueError naming the bad part.
    """
    out: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.replace("==", "=").partition("=")
        key, value = key.strip(), value.strip()
        if not sep or "!" in key or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise ValueError(
                f"--endpoint-selector: {part!r} is not a key=value label requirement"
            )
        out[key] = value
    if not out:
        raise ValueError("--endpoint-selector: must hold at least one key=value label")
    return out


def parse_target_ports(ports: str | Sequence[int]) -> tuple[int, ...]:
    """``"8000,8001"`` (or a list of ints) → ports, checked as the InferencePool's are."""
    if isinstance(ports, str):
        try:
            values = [int(p) for p in ports.split(",") if p.strip()]
        except ValueError:
            raise ValueError(
                f"--endpoint-target-ports: {ports!r} must be a comma list of ports"
            ) from None
    else:
        values = list(ports)
    if not 1 <= len(values) <= MAX_TARGET_PORTS:
        raise ValueError(f"--endpoint-target-ports: needs 1 to {MAX_TARGET_PORTS} ports")
    for p in values:
        if not 1 <= p <= 65535:
            raise ValueError(f"--endpoint-target-ports: {p} is not a port number")
    if len(set(values)) != len(values):
        raise ValueError("--endpoint-target-ports: a port is listed twice")
    return tuple(values)


def standalone_pool(selector: str, target_ports: str | Sequence[int], *,
                    pool_name: str | None, namespace: str) -> Pool:
    """The pool ``--endpoint-selector``/``--endpoint-target-ports`` describe, named
    ``--pool-name`` (default :data:`STANDALONE_POOL_NAME`); ValueError names the bad flag."""
    return Pool(
        ref=ObjectRef("InferencePool", namespace, pool_name or STANDALONE_POOL_NAME),
        api_version=POOL_V1,
        selector=parse_endpoint_selector(selector),
        target_ports=parse_target_ports(target_ports),
    )
