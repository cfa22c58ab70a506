"""Base-model mappings from Kubernetes ConfigMaps, watched live.

A ConfigMap labelled ``inference.networking.k8s.io/bbr-managed: "true"`` holds one base model
and its LoRA adapters::

    data:
      baseModel: meta-llama/Llama-3.1-8B-Instruct
      adapters: |
        - food-review
        - sql-lora

Every labelled ConfigMap of the namespace (or of all namespaces) is merged into one mapping
(adapter → base, base → itself) and installed with :meth:`StaticBaseModels.replace` on each
change, so ``base-model-to-header`` always reads a whole mapping. A ConfigMap that does not
parse is logged and left out; the others still apply.

The watch runs on a :class:`~shared.reflector.Reflector` thread (the sync ``kubernetes``
client; see that module for why). The mapping is swapped in with one reference assignment,
which readers on the event loop see atomically, so no hop onto the loop is needed here.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog
import yaml

from bbr.basemodels import BaseModelError, StaticBaseModels, mapping_from_entries
from shared.flags import Parser
from shared.reflector import (
    Delete,
    Delta,
    RawObject,
    Reflector,
    Replace,
    Upsert,
    WatchTiming,
    object_key,
)

log = structlog.get_logger(__name__)

#: Label that marks a ConfigMap as a base-model mapping for BBR.
MANAGED_LABEL: Final = "inference.networking.k8s.io/bbr-managed"
LABEL_SELECTOR: Final = f"{MANAGED_LABEL}=true"


def add_flags(p: Parser) -> None:
    """Add ``--base-models-from-configmaps`` and ``--configmap-namespace`` to bbr's parser."""
    p.add_bool("--base-models-from-configmaps", default=False,
               help=f"read adapter -> base-model mappings from ConfigMaps labelled "
                    f"{MANAGED_LABEL}=true, watched live (in-cluster config or KUBECONFIG)")
    p.add_argument("--configmap-namespace", default=os.environ.get("NAMESPACE") or "default",
                   help="namespace of those ConfigMaps (default: $NAMESPACE, else default; "
                        "empty: all namespaces)")


def mapping_from_configmap(cm: RawObject) -> dict[str, str]:
    """The mapping one ConfigMap contributes; :class:`BaseModelError` names the ConfigMap."""
    ns, name = object_key(cm)
    data = cm.get("data") or {}
    if not isinstance(data, Mapping):
        raise BaseModelError(f"ConfigMap {ns}/{name}: data must be a mapping")
    entry = {"baseModel": data.get("baseModel"), "adapters": data.get("adapters")}
    try:
        return mapping_from_entries([entry], f"ConfigMap {ns}/{name}")
    except yaml.YAMLError as e:
        raise BaseModelError(f"ConfigMap {ns}/{name}: 'adapters' is not valid YAML: {e}") from e


class ConfigMapBaseModels:
    """Keeps a :class:`StaticBaseModels` equal to the union of the labelled ConfigMaps."""

    def __init__(self, base_models: StaticBaseModels) -> None:
        self.base_models = base_models
        self._configmaps: dict[tuple[str, str], RawObject] = {}
        self._lock = threading.Lock()

    def apply(self, delta: Delta) -> None:
        """Fold one watch change in and install the rebuilt mapping."""
        with self._lock:
            if isinstance(delta, Replace):
                self._configmaps = {object_key(cm): cm for cm in delta.items}
            elif isinstance(delta, Upsert):
                self._configmaps[object_key(delta.obj)] = delta.obj
            elif isinstance(delta, Delete):
                self._configmaps.pop(object_key(delta.obj), None)
            self.base_models.replace(self._rebuild())

    def _rebuild(self) -> dict[str, str]:
        mapping: dict[str, str] = {}
        # Name order makes the winner of a conflict deterministic (and documented).
        for key in sorted(self._configmaps):
            try:
                part = mapping_from_configmap(self._configmaps[key])
            except BaseModelError as e:
                log.warning("invalid base-model ConfigMap skipped", error=str(e))
                continue
            for model, base in part.items():
                if mapping.get(model, base) != base:
                    log.warning("model mapped by several ConfigMaps; the later one wins",
                                model=model, configmap=f"{key[0]}/{key[1]}")
                mapping[model] = base
        return mapping


class ConfigMapWatch:
    """Handle on a running ConfigMap watch."""

    def __init__(self, reflector: Reflector) -> None:
        self._reflector = reflector

    @property
    def synced(self) -> bool:
        """True once the ConfigMaps have been listed (the mapping is complete)."""
        return self._reflector.synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until listed (or ``timeout``); True when synced."""
        return self._reflector.synced.wait(timeout)

    def stop(self) -> None:
        """Stop watching (returns at once)."""
        self._reflector.stop()


def start_configmap_watch(
    base_models: StaticBaseModels,
    namespace: str | None = None,
    api_client: Any = None,
    *,
    timing: WatchTiming | None = None,
) -> ConfigMapWatch:
    """Watch the labelled ConfigMaps of ``namespace`` (None or "": all namespaces) and keep
    ``base_models`` in step; returns a handle with ``stop()``."""
    from kubernetes import client

    if api_client is None:
        from shared.reflector import load_api_client

        api_client = load_api_client()
    core = client.CoreV1Api(api_client)
    list_func: Callable[..., Any]
    if namespace:
        list_func = functools.partial(core.list_namespaced_config_map, namespace)
    else:
        list_func = core.list_config_map_for_all_namespaces
    target = ConfigMapBaseModels(base_models)
    reflector = Reflector("configmaps", list_func, target.apply,
                          label_selector=LABEL_SELECTOR, timing=timing)
    reflector.start()
    log.info("watching base-model ConfigMaps", namespace=namespace or "<all>",
             selector=LABEL_SELECTOR)
    return ConfigMapWatch(reflector)
