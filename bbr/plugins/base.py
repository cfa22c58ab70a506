"""The BBR plugin kind and its handle (the registry is :mod:`shared.plugins`, shared with
the EPP)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from bbr.basemodels import BaseModels, StaticBaseModels
from shared.plugins import Handle, Plugin


class HeaderPlugin(Plugin, ABC):
    """What the router calls for each request with a JSON body."""

    @property
    @abstractmethod
    def owned_headers(self) -> tuple[str, ...]:
        """Headers this plugin sets; a client's own copies are removed."""

    @abstractmethod
    def headers(self, body: dict[str, Any]) -> dict[str, str]:
        """Headers to set for this body (empty: none)."""


class BbrHandle(Handle):
    """What a BBR plugin factory sees: the base-model table and the other plugins."""

    def __init__(self, base_models: BaseModels | None = None) -> None:
        super().__init__()
        self.base_models = base_models if base_models is not None else StaticBaseModels()
