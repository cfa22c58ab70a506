"""``base-model-to-header``: the requested model's base model into a header."""

from __future__ import annotations

from typing import Any, ClassVar

from bbr.basemodels import BaseModels
from bbr.plugins.params import FieldToHeader

BASE_MODEL_HEADER = "X-Gateway-Base-Model-Name"


class BaseModelToHeader:
    """adapter → its base model; base model → itself; unknown or missing → no header.

    Lets one HTTPRoute rule per base model serve every LoRA adapter loaded on that pool.
    """

    type_name: ClassVar[str] = "base-model-to-header"

    def __init__(self, name: str, params: FieldToHeader, base_models: BaseModels) -> None:
        self.name = name
        self.params = params
        self.base_models = base_models
        self._header = params.header_name.lower()

    @classmethod
    def create(cls, name: str, raw: dict[str, Any], base_models: BaseModels) -> BaseModelToHeader:
        return cls(name, FieldToHeader.parse(raw, BASE_MODEL_HEADER), base_models)

    @property
    def owned_headers(self) -> tuple[str, ...]:
        return (self._header,)

    def headers(self, body: dict[str, Any]) -> dict[str, str]:
        model = body.get(self.params.field)
        if not isinstance(model, str) or not model:
            return {}
        base = self.base_models.base_of(model)
        return {self._header: base} if base else {}
