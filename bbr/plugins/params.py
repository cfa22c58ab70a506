"""The parameters both BBR plugins take: which body field, and which header to set."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldToHeader:
    """``{"field": "model", "headerName": "..."}`` (each plugin has its own default
    header)."""

    field: str = "model"
    header_name: str = ""

    def __post_init__(self) -> None:
        if not self.field or not self.header_name:
            raise ValueError("'field' and 'headerName' must not be empty")
