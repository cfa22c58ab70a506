"""``body-field-to-header``: copy one top-level body field into a request header."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from bbr.metrics import FIELD_EMPTY, FIELD_NOT_FOUND
from bbr.plugins.base import HeaderPlugin
from bbr.plugins.params import FieldToHeader

MODEL_HEADER = "X-Gateway-Model-Name"
#: Longest value copied into a header. Envoy answers 500 for the whole request when a
#: mutation would push the headers past its limit (60 KiB by default).
MAX_HEADER_VALUE = 8192
#: Characters Envoy refuses in a header value (it then fails the request with a 500):
#: controls other than tab, and DEL.
_NOT_IN_HEADERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class BodyFieldParameters(FieldToHeader):
    """Default header: ``X-Gateway-Model-Name``."""

    header_name: str = MODEL_HEADER


class BodyFieldToHeader(HeaderPlugin):
    """Sets ``header_name`` to the string value of ``field``.

    A missing or non-string field sets no header, and neither does an empty string or one no
    header can carry (control characters, over 8 KiB); the request passes to the default
    route, counted in ``bbr_body_field_not_found_total`` / ``bbr_body_field_empty_total``.
    """

    type_name = "body-field-to-header"
    parameters_type = BodyFieldParameters
    params: BodyFieldParameters

    def __init__(self, name: str = "", params: BodyFieldParameters | None = None) -> None:
        super().__init__(name, params)
        self._header = self.params.header_name.lower()
        self._not_found: Counter = FIELD_NOT_FOUND.labels(field=self.params.field)
        self._empty: Counter = FIELD_EMPTY.labels(field=self.params.field)

    @property
    def owned_headers(self) -> tuple[str, ...]:
        return (self._header,)

    def headers(self, body: dict[str, Any]) -> dict[str, str]:
        value = body.get(self.params.field)
        if not isinstance(value, str) or len(value.encode()) > MAX_HEADER_VALUE or (
                _NOT_IN_HEADERS.search(value) is not None):
            self._not_found.inc()
            return {}
        if not value:
            self._empty.inc()
            return {}
        return {self._header: value}
