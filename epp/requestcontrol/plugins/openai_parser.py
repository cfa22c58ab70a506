"""``openai-parser``: reads OpenAI-style bodies (completions, chat, embeddings, responses)."""

from __future__ import annotations

from epp.requestcontrol.plugin import Parser
from epp.scheduling.plugin import Plugin
from shared.openai import OpenAIRequest, parse_request


class OpenAIParser(Plugin, Parser):
    """The body must be a JSON object with the API's required field (``messages``,
    ``prompt`` or ``input``) and, when it has ``model``, a string there; 400 otherwise. A
    body without ``model`` (or with ``""``) goes to a match-all InferenceModelRewrite, which
    names the model; without one it is a 400 (upstream v0.10, llm-d-router PR 1426).
    Upstream's default parser, and ours."""

    type_name = "openai-parser"
    paths = ("chat/completions", "completions", "embeddings", "responses", "conversations",
             "chat/completions/render", "completions/render", "images/generations")

    def parse(self, body: bytes, path: str) -> OpenAIRequest:
        return parse_request(body, path, require_model=False)
