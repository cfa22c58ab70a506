"""``passthrough-parser``: for bodies that are not OpenAI JSON (custom APIs, binary
payloads): nothing is read from the body and it goes to the endpoint unchanged."""

from __future__ import annotations

from epp.requestcontrol.plugin import Parser
from epp.scheduling.plugin import Plugin
from shared.openai import ApiKind, OpenAIRequest


class PassthroughParser(Plugin, Parser):
    """Every body is accepted as is. The request has no model (so no rewrite applies and
    the body is never re-encoded) and no prompt (prefix scoring sees an empty prompt);
    scheduling uses load and the other body-free signals."""

    type_name = "passthrough-parser"

    def parse(self, body: bytes, path: str) -> OpenAIRequest:
        return OpenAIRequest(kind=ApiKind.OTHER, body={}, model="")
