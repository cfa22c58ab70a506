"""The parameters both BBR plugins take: which body field, and which header to set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FieldToHeader:
    """``{"field": "model", "headerName": "..."}``."""

    field: str
    header_name: str

    @classmethod
    def parse(cls, raw: dict[str, Any], default_header: str) -> FieldToHeader:
        """From a ``--plugin`` JSON object; ValueError names what is wrong."""
        unknown = set(raw) - {"field", "headerName"}
        if unknown:
            raise ValueError(f"unknown parameters {sorted(unknown)}")
        params = cls(str(raw.get("field", "model")), str(raw.get("headerName", default_header)))
        if not params.field or not params.header_name:
            raise ValueError("'field' and 'headerName' must not be empty")
        return params
