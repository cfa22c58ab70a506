"""OpenAI request parsing and response/SSE building for the simulator (no I/O here)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import orjson

from modelserver.multimodal import mm_items, unique_items
from sim.engine import SimRequest
from sim.tokenizer import VOCAB, apply_chat_template, output_token


class ApiError(Exception):
    """A request-ending error, rendered the way vLLM renders it."""

    def __init__(self, status: int, message: str, err_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = err_type or _TYPES.get(status, "InternalServerError")

    def body(self) -> bytes:
        """``{"error": {"message", "type", "param", "code"}}`` (vLLM's current shape)."""
        return orjson.dumps({"error": {"message": self.message, "type": self.type,
                                       "param": None, "code": self.status}})


_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "TooManyRequestsError",
          500: "InternalServerError", 503: "ServiceUnavailableError"}


@dataclass(slots=True)
class ParsedRequest:
    """What the simulator needs from a completions or chat request."""

    chat: bool
    model: str
    prompt: bytes
    max_tokens: int | None
    stream: bool
    include_usage: bool
    cache_salt: str
    #: P/D connector parameters (vLLM's ``kv_transfer_params``), if the body had any.
    kv_transfer_params: dict[str, Any] | None = None
    #: Hashes of the chat's unique multimodal items (:mod:`modelserver.multimodal`).
    mm_hashes: tuple[str, ...] = ()
    #: The id the body gave the request (vLLM generate's ``request_id``, SGLang's ``rid``).
    request_id: str | None = None


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object, or :class:`ApiError` (400)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object")
    return body


def parse_request(raw: bytes, *, chat: bool) -> ParsedRequest:
    """Validate a ``/v1/completions`` or ``/v1/chat/completions`` body.

    Raises :class:`ApiError` (400) for malformed JSON or a wrong shape.
    """
    body = json_object(raw)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' is required and must be a non-empty list")
        try:
            prompt = apply_chat_template(messages).encode()
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
    else:
        if "prompt" not in body:
            raise ApiError(400, "'prompt' is required")
        prompt = _prompt_bytes(body["prompt"])
        max_tokens = body.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise ApiError(400, "'max_tokens' must be a positive integer")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise ApiError(400, "'stream_options' must be an object")
        if not stream:
            raise ApiError(400, "Stream options can only be defined when `stream=True`.")
        include_usage = bool(opts.get("include_usage", False))
    salt = body.get("cache_salt") or ""
    if not isinstance(salt, str):
        raise ApiError(400, "'cache_salt' must be a string")
    kv_params = body.get("kv_transfer_params")
    if kv_params is not None and not isinstance(kv_params, dict):
        raise ApiError(400, "'kv_transfer_params' must be an object")
    mm = tuple(i.hash for i in unique_items(mm_items(body["messages"]))) if chat else ()
    return ParsedRequest(chat=chat, model=model or "", prompt=prompt, max_tokens=max_tokens,
                         stream=stream, include_usage=include_usage, cache_salt=salt,
                         kv_transfer_params=kv_params, mm_hashes=mm)


def tokenize_input(body: dict[str, Any]) -> bytes:
    """The prompt bytes of a vLLM ``/tokenize`` body: ``prompt`` or chat ``messages``."""
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list")
        try:
            return apply_chat_template(messages).encode()
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
    if "prompt" in body:
        return _prompt_bytes(body["prompt"])
    raise ApiError(400, "either 'prompt' or 'messages' is required")


def _prompt_bytes(prompt: Any) -> bytes:
    """A completions prompt: a string, a one-string list, or a list of token ids."""
    if isinstance(prompt, str):
        return prompt.encode()
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0].encode()
    if isinstance(prompt, list) and prompt and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt
    ):
        # Token ids map 1:1 onto 4-byte tokens, so the count (and prefix sharing) is preserved.
        return b"".join((t & 0xFFFFFFFF).to_bytes(4, "little") for t in prompt)
    raise ApiError(400, "'prompt' must be a string, a list with one string, or token ids")


def new_id(chat: bool) -> str:
    """A fresh response id in OpenAI's style."""
    return ("chatcmpl-" if chat else "cmpl-") + os.urandom(12).hex()


def usage(req: SimRequest) -> dict[str, Any]:
    """The ``usage`` object (with vLLM's optional ``prompt_tokens_details``)."""
    return {
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": req.generated,
        "total_tokens": req.prompt_tokens + req.generated,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


def output_text(req: SimRequest, start: int = 0, stop: int | None = None) -> str:
    """Generated text of tokens ``start..stop``."""
    seed = req.text_seed
    end = req.generated if stop is None else stop
    return "".join(output_token(seed, i) for i in range(start, end))


def full_response(req: SimRequest, *, chat: bool, model: str, rid: str,
                  kv_transfer_params: dict[str, Any] | None = None) -> bytes:
    """The non-streaming JSON body (with ``kv_transfer_params`` when a prefill leg kept its
    KV for a decoder, as vLLM's P/D connectors return it)."""
    text = output_text(req)
    choice: dict[str, Any]
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": req.finish_reason, "stop_reason": None}
    else:
        choice = {"index": 0, "text": text, "logprobs": None,
                  "finish_reason": req.finish_reason, "stop_reason": None}
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(req),
    }
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    return orjson.dumps(body)


#: JSON-escaped vocabulary, so SSE chunks are built by concatenation, not serialisation.
_VOCAB_JSON = tuple(orjson.dumps(w) for w in VOCAB)


class SseWriter:
    """Builds the SSE byte stream of one streaming response, one ``data:`` event per token."""

    def __init__(self, req: SimRequest, *, chat: bool, model: str, rid: str,
                 include_usage: bool) -> None:
        self.req = req
        self.chat = chat
        self.include_usage = include_usage
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model}
        self._head = orjson.dumps(head)[:-1]  # without the closing brace
        if chat:
            self._pre = b'data: ' + self._head + b',"choices":[{"index":0,"delta":{"content":'
            self._mid = b'},"logprobs":null,"finish_reason":'
        else:
            self._pre = b'data: ' + self._head + b',"choices":[{"index":0,"text":'
            self._mid = b',"logprobs":null,"finish_reason":'
        self.sent = 0

    def preamble(self) -> bytes:
        """Chat streams start with the assistant role (as vLLM does); completions do not."""
        if not self.chat:
            return b""
        return (b'data: ' + self._head + b',"choices":[{"index":0,"delta":{"role":"assistant",'
                b'"content":""},"logprobs":null,"finish_reason":null}]}\n\n')

    def take(self) -> bytes:
        """Events for the tokens generated since the last call (plus the end, if done)."""
        req = self.req
        n = req.generated
        out = []
        seed = req.text_seed
        vocab = _VOCAB_JSON
        size = len(vocab)
        last = n - 1 if req.done else n
        for i in range(self.sent, n):
            word = vocab[(seed + i * 7) % size]
            reason = orjson.dumps(req.finish_reason) if i == last else b"null"
            out.append(self._pre + word + self._mid + reason + b"}]}\n\n")
        self.sent = n
        if req.done:
            if self.include_usage:
                out.append(b'data: ' + self._head + b',"choices":[],"usage":'
                           + orjson.dumps(usage(req)) + b"}\n\n")
            out.append(b"data: [DONE]\n\n")
        return b"".join(out)
