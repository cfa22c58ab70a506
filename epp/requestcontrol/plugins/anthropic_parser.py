"""``anthropic-parser``: reads Anthropic Messages API bodies (``/v1/messages``) and lets
``/v1/messages/count_tokens`` through unread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from epp.requestcontrol.plugin import Parser
from epp.scheduling.plugin import Plugin
from shared.errors import BadRequest
from shared.openai import ApiKind, OpenAIRequest, model_field, parse_json_object

MESSAGES = "messages"
COUNT_TOKENS = "messages/count_tokens"


@dataclass(slots=True)
class AnthropicRequest(OpenAIRequest):
    """A Messages body. Its system prompt is a top-level field, not a message: prefix
    scoring reads it first, as the chat template puts it first."""

    @property
    def messages(self) -> list[Any] | None:
        msgs = self.body.get("messages")
        if not isinstance(msgs, list):
            return None
        system = self.body.get("system")
        return msgs if system in (None, "", []) else [{"role": "system", "content": system},
                                                      *msgs]


class AnthropicParser(Plugin, Parser):
    """``/v1/messages``: the body must be a JSON object with a non-empty ``messages`` list
    and, when it has ``model``, a string there (400 otherwise, in Anthropic's error shape).
    Without ``model`` a match-all InferenceModelRewrite names it, as for ``openai-parser``.
    ``stream`` and ``max_tokens`` are read; a rewrite writes the new ``model`` into the body.
    The response's ``model`` (JSON, or ``message_start`` when streamed) goes back to the
    client's name; usage is ``input_tokens``, ``output_tokens`` and
    ``cache_read_input_tokens`` (from ``message_start`` and ``message_delta`` when streamed).
    ``/v1/messages/count_tokens`` is routed by load with its body unread and unchanged (no
    rewrite), as upstream. Upstream's parser (llm-d-router v0.10, Beta)."""

    type_name = "anthropic-parser"
    paths = (COUNT_TOKENS, MESSAGES)

    def parse(self, body: bytes, path: str) -> OpenAIRequest:
        clean = path.split("?", 1)[0].rstrip("/")
        if clean.endswith("/" + COUNT_TOKENS):
            return OpenAIRequest(kind=ApiKind.OTHER, body={}, model="")
        data = parse_json_object(body)
        absent = data.get("model") in (None, "")
        model = "" if absent else model_field(data)
        msgs = data.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list for messages requests",
                             code="invalid_body")
        return AnthropicRequest(kind=ApiKind.MESSAGES, body=data, model=model,
                                model_absent=absent)


__all__ = ["COUNT_TOKENS", "MESSAGES", "AnthropicParser", "AnthropicRequest"]
