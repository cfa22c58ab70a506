"""``openai-parser``: reads OpenAI-style bodies (completions, chat, embeddings, responses)."""

from __future__ import annotations

from epp.requestcontrol.plugin import Parser
from epp.scheduling.plugin import Plugin
from shared.openai import OpenAIRequest, parse_request


class OpenAIParser(Plugin, Parser):
    """The body must be a JSON object with a non-empty string ``model`` and the API's
    required field (``messages``, ``prompt`` or ``input``); 400 otherwise. Upstream's
    default parser, and ours."""

    type_name = "openai-parser"
    paths = ("chat/completions", "completions", "embeddings", "responses", "conversations",
             "chat/completions/render", "completions/render", "images/generations")

    def parse(self, body: bytes, path: str) -> OpenAIRequest:
        return parse_request(body, path)
