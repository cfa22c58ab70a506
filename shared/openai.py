"""OpenAI-compatible request parsing (orjson).

Only what routing needs is validated: the body is a JSON object, ``model`` is a non-empty
string, and the per-API required field is present. Everything else passes through untouched.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import orjson

from shared.errors import BadRequest


class ApiKind(enum.Enum):
    """Which OpenAI API a request path names."""

    COMPLETIONS = "completions"
    CHAT = "chat"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    #: Anthropic Messages (``/v1/messages``).
    MESSAGES = "messages"
    #: A native generate API (vLLM ``/inference/v1/generate``, SGLang ``/generate``).
    GENERATE = "generate"
    OTHER = "other"


_SUFFIXES = (
    ("/chat/completions", ApiKind.CHAT),
    ("/completions", ApiKind.COMPLETIONS),
    ("/embeddings", ApiKind.EMBEDDINGS),
    ("/responses", ApiKind.RESPONSES),
)

#: The field each API cannot do without (upstream answers 400 when it is missing).
_REQUIRED = {
    ApiKind.CHAT: "messages",
    ApiKind.COMPLETIONS: "prompt",
    ApiKind.EMBEDDINGS: "input",
    ApiKind.RESPONSES: "input",
}


def api_kind(path: str) -> ApiKind:
    """The API named by ``:path`` (query string ignored)."""
    path = path.split("?", 1)[0].rstrip("/")
    for suffix, kind in _SUFFIXES:
        if path.endswith(suffix):
            return kind
    return ApiKind.OTHER


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or :class:`BadRequest` saying what is wrong with it."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest(
            f"request body must be a JSON object, got {type(data).__name__}",
            code="invalid_json",
        )
    return data


@dataclass(slots=True)
class OpenAIRequest:
    """A parsed OpenAI-style request body."""

    kind: ApiKind
    body: dict[str, Any]
    model: str
    #: The prompt as token ids, when the API sends it tokenized (vLLM's gRPC API).
    token_ids: list[int] | None = None
    #: The JSON body names no model (absent or ""), parsed with ``require_model=False``:
    #: whoever routes it must name one in the body (the EPP: a match-all rewrite).
    model_absent: bool = False

    @property
    def stream(self) -> bool:
        """True when the client asked for an SSE stream."""
        return self.body.get("stream") is True

    @property
    def prompt(self) -> Any:
        """``prompt`` (completions) or ``input`` (embeddings, responses); None for chat."""
        return self.body.get("prompt", self.body.get("input"))

    @property
    def messages(self) -> list[Any] | None:
        """Chat ``messages``; None for other APIs."""
        msgs = self.body.get("messages")
        return msgs if isinstance(msgs, list) else None

    @property
    def limits(self) -> dict[str, Any]:
        """Where the body keeps its output cap (``max_tokens`` and kin): the body itself
        for OpenAI and Anthropic; native generate APIs nest it in ``sampling_params``."""
        return self.body

    def dumps(self) -> bytes:
        """The body re-encoded (after a mutation such as a model rewrite)."""
        return orjson.dumps(self.body)


def model_field(data: dict[str, Any]) -> str:
    """``model`` as a non-empty string, or :class:`BadRequest`."""
    model = data.get("model")
    if model is None:
        raise BadRequest("the request has no 'model' field", code="missing_model")
    if not isinstance(model, str):
        raise BadRequest(
            f"'model' must be a string, got {type(model).__name__}", code="invalid_model"
        )
    if not model:
        raise BadRequest("'model' must not be empty", code="missing_model")
    return model


def parse_request(body: bytes, path: str, *, require_model: bool = True) -> OpenAIRequest:
    """Parse and check a request for ``path``; :class:`BadRequest` when it can't be routed.
    ``require_model=False``: an absent or empty ``model`` is not an error here (the request
    comes back with ``model_absent``); a ``model`` that is not a string still is."""
    data = parse_json_object(body)
    kind = api_kind(path)
    absent = not require_model and data.get("model") in (None, "")
    model = "" if absent else model_field(data)
    required = _REQUIRED.get(kind)
    if required is not None and required not in data:
        raise BadRequest(f"'{required}' is required for {kind.value} requests", code="invalid_body")
    if kind is ApiKind.CHAT and not isinstance(data["messages"], list):
        raise BadRequest("'messages' must be a list", code="invalid_body")
    return OpenAIRequest(kind=kind, body=data, model=model, model_absent=absent)
