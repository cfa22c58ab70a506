"""``base-model-to-header``: the requested model's base model into a header."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bbr.basemodels import BaseModels, StaticBaseModels
from bbr.plugins.base import BbrHandle, HeaderPlugin
from bbr.plugins.params import FieldToHeader
from shared.plugins import Handle

BASE_MODEL_HEADER = "X-Gateway-Base-Model-Name"


@dataclass(frozen=True, slots=True)
class BaseModelParameters(FieldToHeader):
    """Default header: ``X-Gateway-Base-Model-Name``."""

    header_name: str = BASE_MODEL_HEADER


class BaseModelToHeader(HeaderPlugin):
    """adapter → its base model; base model → itself; unknown or missing → no header.

    Lets one HTTPRoute rule per base model serve every LoRA adapter loaded on that pool.
    The adapter → base table comes from the handle (``--base-models`` or ConfigMaps).
    """

    type_name = "base-model-to-header"
    parameters_type = BaseModelParameters
    params: BaseModelParameters

    def __init__(self, name: str = "", params: BaseModelParameters | None = None,
                 base_models: BaseModels | None = None) -> None:
        super().__init__(name, params)
        self.base_models = base_models if base_models is not None else StaticBaseModels()
        self._header = self.params.header_name.lower()

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> BaseModelToHeader:
        base = handle.base_models if isinstance(handle, BbrHandle) else None
        return cls(name, params, base)

    @property
    def owned_headers(self) -> tuple[str, ...]:
        return (self._header,)

    def headers(self, body: dict[str, Any]) -> dict[str, str]:
        model = body.get(self.params.field)
        if not isinstance(model, str) or not model:
            return {}
        base = self.base_models.base_of(model)
        return {self._header: base} if base else {}
