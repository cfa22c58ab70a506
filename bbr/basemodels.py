"""Where adapter → base-model names come from.

:class:`BaseModels` is the interface; :class:`FileBaseModels` reads a standalone YAML file
(``--base-models``). The Kubernetes ConfigMap source implements the same interface.

File format, one entry per base model (the same keys the labelled ConfigMaps carry)::

    - baseModel: meta-llama/Llama-3.1-8B-Instruct
      adapters: [food-review, sql-lora]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml


class BaseModelError(ValueError):
    """The mapping source is unreadable or malformed."""


class BaseModels(Protocol):
    """Looks up the base model of a model or adapter name."""

    def base_of(self, model: str) -> str | None:
        """The base model (itself for a base model), or None when unknown."""


class StaticBaseModels:
    """An in-memory mapping, replaced whole on update (readers never see half of one)."""

    def __init__(self, mapping: Mapping[str, str] | None = None) -> None:
        self._map: dict[str, str] = dict(mapping or {})

    def base_of(self, model: str) -> str | None:
        return self._map.get(model)

    def entries(self) -> Mapping[str, str]:
        """The whole mapping (model or adapter → base), as last installed; do not modify."""
        return self._map

    def replace(self, mapping: Mapping[str, str]) -> None:
        self._map = dict(mapping)


def mapping_from_entries(entries: Iterable[Mapping[str, Any]], where: str) -> dict[str, str]:
    """``[{baseModel, adapters}]`` → ``{adapter: base, base: base}``; errors name ``where``."""
    out: dict[str, str] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise BaseModelError(f"{where}: entry {i} must be a mapping")
        base = entry.get("baseModel")
        if not isinstance(base, str) or not base:
            raise BaseModelError(f"{where}: entry {i}: 'baseModel' must be a non-empty string")
        adapters = entry.get("adapters") or []
        if isinstance(adapters, str):  # a ConfigMap value holds the YAML list as text
            adapters = yaml.safe_load(adapters) or []
        if not isinstance(adapters, list) or not all(isinstance(a, str) for a in adapters):
            raise BaseModelError(f"{where}: entry {i}: 'adapters' must be a list of strings")
        out[base] = base
        for adapter in adapters:
            out[adapter] = base
    return out


class FileBaseModels(StaticBaseModels):
    """The mapping read from a YAML file (a list of ``{baseModel, adapters}``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            data = yaml.safe_load(self.path.read_text())
        except OSError as e:
            raise BaseModelError(f"cannot read base-models file {self.path}: {e.strerror}") from e
        except yaml.YAMLError as e:
            raise BaseModelError(f"base-models file {self.path} is not valid YAML: {e}") from e
        if data is None:
            data = []
        if not isinstance(data, list):
            raise BaseModelError(f"{self.path}: expected a list of {{baseModel, adapters}}")
        super().__init__(mapping_from_entries(data, str(self.path)))
