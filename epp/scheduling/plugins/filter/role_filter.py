"""``prefill-filter``, ``decode-filter`` and ``encode-filter``: keep endpoints by their pod's
``llm-d.ai/role`` label, as llm-d's filters of the same names (roles in :mod:`modelserver.pd`)."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.request import LLMRequest
from modelserver.pd import can_decode, can_encode, can_prefill


class PrefillFilter(Filter):
    """Keeps endpoints whose role may prefill: ``prefill``, ``encode-prefill``,
    ``prefill-decode``, ``both``, ``encode-prefill-decode``. A pod without the label is
    dropped (it is a decoder, as in llm-d)."""

    type_name = "prefill-filter"

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        return [v for v in endpoints if can_prefill(v.endpoint.labels)]


class DecodeFilter(Filter):
    """Keeps endpoints whose role may decode: ``decode``, ``prefill-decode``, ``both``,
    ``encode-prefill-decode``, or no role label at all."""

    type_name = "decode-filter"

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        return [v for v in endpoints if can_decode(v.endpoint.labels)]


class EncodeFilter(Filter):
    """Keeps endpoints whose role may encode multimodal items: ``encode``,
    ``encode-prefill``, ``encode-prefill-decode``. A pod without the label is dropped."""

    type_name = "encode-filter"

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        return [v for v in endpoints if can_encode(v.endpoint.labels)]
