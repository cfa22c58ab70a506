"""The parameters both BBR plugins take: which body field, and which header to set."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class FieldToHeader:
    """``{"field": "model", "headerName": "..."}`` (each plugin has its own default
    header); upstream's ``fieldName`` is the same parameter as ``field``."""

    ALIASES: ClassVar[Mapping[str, str]] = {"fieldName": "field"}

    field: str = "model"
    header_name: str = ""

    def __post_init__(self) -> None:
        if not self.field or not self.header_name:
            raise ValueError("'field' and 'headerName' must not be empty")
