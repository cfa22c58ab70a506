"""``always-disagg-multimodal-decider`` (llm-d-router v0.10): the encode decider of
``disagg-profile-handler`` (``deciders.encode``)."""

from __future__ import annotations

from epp.datastore import EndpointView
from epp.scheduling.plugins.profile.pd_deciders import PDDecider
from epp.scheduling.request import LLMRequest


class AlwaysDisaggMultimodalDecider(PDDecider):
    """encode elsewhere = the request has at least one multimodal item (an ``image_url``,
    ``video_url``, ``input_audio`` or ``audio_url`` block in its chat content,
    :func:`modelserver.multimodal.mm_items`); text-only requests skip the encode stage."""

    type_name = "always-disagg-multimodal-decider"

    def disaggregate(self, request: LLMRequest, decode: EndpointView | None) -> bool:
        return bool(request.mm_items)
