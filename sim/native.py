"""The simulator's APIs besides OpenAI's, in the shapes vLLM (and SGLang) serve them: Anthropic
Messages (``/v1/messages``, ``/v1/messages/count_tokens``), vLLM's token-in/token-out
``/inference/v1/generate`` and SGLang's ``/generate``. Each :class:`Api` parses its body into
the :class:`sim.openai.ParsedRequest` the engine runs and renders the answer, whole or as an
SSE stream (no I/O here; :mod:`sim.server` drives them)."""

from __future__ import annotations

import os
import uuid
from typing import Any, Protocol

import orjson

from sim.engine import SimRequest
from sim.openai import (
    ApiError,
    ParsedRequest,
    SseWriter,
    _prompt_bytes,
    full_response,
    json_object,
    new_id,
    output_text,
    parse_request,
    usage,
)
from sim.tokenizer import VOCAB, apply_chat_template, output_token


class Writer(Protocol):
    """An SSE stream under construction (:class:`sim.openai.SseWriter` is one)."""

    req: SimRequest
    sent: int

    def preamble(self) -> bytes:
        """What the stream starts with, before any token."""

    def take(self) -> bytes:
        """Events for tokens generated since the last call (and the end, once done)."""


class Api(Protocol):
    """One request/response dialect the simulator serves."""

    def parse(self, raw: bytes) -> ParsedRequest:
        """The body, checked; :class:`ApiError` (400) when it is malformed."""

    def new_id(self, request_id: str | None) -> str:
        """The response id (vLLM's generate echoes the request's)."""

    def full(self, req: SimRequest, *, model: str, rid: str,
             kv_transfer_params: dict[str, Any] | None) -> bytes:
        """The non-streamed JSON answer."""

    def writer(self, req: SimRequest, *, model: str, rid: str, include_usage: bool) -> Writer:
        """The streamed answer's builder."""

    def error(self, exc: ApiError) -> bytes:
        """An error body in this API's shape."""


def _positive(value: Any, name: str) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or value < 1):
        raise ApiError(400, f"'{name}' must be a positive integer")
    return value


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be a boolean")
    return value


def _model(body: dict[str, Any], *, required: bool) -> str:
    model = body.get("model")
    if model is None and not required:
        return ""
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required and must be a string")
    return model


def token_id(req: SimRequest, i: int) -> int:
    """The id of generated token ``i`` (its index in the simulator's vocabulary, the word
    :func:`sim.tokenizer.output_token` writes)."""
    return (req.text_seed + i * 7) % len(VOCAB)


# -- OpenAI (the original endpoints, behind the same interface) ---------------------------------


class OpenAIApi:
    """``/v1/completions`` (``chat=False``) and ``/v1/chat/completions``."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat

    def parse(self, raw: bytes) -> ParsedRequest:
        return parse_request(raw, chat=self.chat)

    def new_id(self, request_id: str | None) -> str:
        return new_id(self.chat)

    def full(self, req: SimRequest, *, model: str, rid: str,
             kv_transfer_params: dict[str, Any] | None) -> bytes:
        return full_response(req, chat=self.chat, model=model, rid=rid,
                             kv_transfer_params=kv_transfer_params)

    def writer(self, req: SimRequest, *, model: str, rid: str, include_usage: bool) -> Writer:
        return SseWriter(req, chat=self.chat, model=model, rid=rid, include_usage=include_usage)

    def error(self, exc: ApiError) -> bytes:
        return exc.body()


# -- Anthropic Messages ----------------------------------------------------------------------------

#: vLLM's mapping of its finish reasons onto Anthropic's stop reasons.
_STOP = {"stop": "end_turn", "length": "max_tokens"}
#: Anthropic's error type per status (vLLM's Anthropic endpoints answer in this envelope).
_ANTHROPIC_ERRORS = {400: "invalid_request_error", 404: "not_found_error",
                     429: "rate_limit_error", 503: "overloaded_error"}


def messages_prompt(body: dict[str, Any]) -> bytes:
    """The chat-templated prompt of a Messages body: ``system`` (a string or text blocks)
    first, then ``messages``; :class:`ApiError` (400) when they are malformed."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' is required and must be a non-empty list")
    system = body.get("system")
    if system not in (None, "", []):
        if not isinstance(system, str | list):
            raise ApiError(400, "'system' must be a string or a list of text blocks")
        messages = [{"role": "system", "content": system}, *messages]
    try:
        return apply_chat_template(messages).encode()
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


def anthropic_usage(req: SimRequest, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": req.prompt_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": req.cached_tokens}


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class AnthropicApi:
    """``/v1/messages`` as vLLM serves it: ``model``, ``messages`` and ``max_tokens``
    required; the answer is a ``message`` with text content blocks; streamed, the event
    sequence ``message_start`` → ``content_block_start`` → ``content_block_delta``… →
    ``content_block_stop`` → ``message_delta`` (stop reason, usage) → ``message_stop``."""

    def parse(self, raw: bytes) -> ParsedRequest:
        body = json_object(raw)
        model = _model(body, required=True)
        prompt = messages_prompt(body)
        if body.get("max_tokens") is None:
            raise ApiError(400, "'max_tokens' is required")
        max_tokens = _positive(body.get("max_tokens"), "max_tokens")
        return ParsedRequest(chat=True, model=model, prompt=prompt, max_tokens=max_tokens,
                             stream=_flag(body, "stream"), include_usage=True, cache_salt="")

    def new_id(self, request_id: str | None) -> str:
        return "msg_" + os.urandom(12).hex()

    def full(self, req: SimRequest, *, model: str, rid: str,
             kv_transfer_params: dict[str, Any] | None) -> bytes:
        return orjson.dumps({
            "id": rid, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": output_text(req)}],
            "stop_reason": _STOP.get(req.finish_reason or "", "end_turn"),
            "stop_sequence": None, "usage": anthropic_usage(req, req.generated)})

    def writer(self, req: SimRequest, *, model: str, rid: str, include_usage: bool) -> Writer:
        return AnthropicWriter(req, model=model, rid=rid)

    def error(self, exc: ApiError) -> bytes:
        return orjson.dumps({"type": "error", "error": {
            "type": _ANTHROPIC_ERRORS.get(exc.status, "api_error"), "message": exc.message}})


class AnthropicWriter:
    """The Messages event stream of one request, one ``text_delta`` per token."""

    def __init__(self, req: SimRequest, *, model: str, rid: str) -> None:
        self.req, self.model, self.rid = req, model, rid
        self.sent = 0

    def preamble(self) -> bytes:
        message: dict[str, Any] = {"id": self.rid, "type": "message", "role": "assistant",
                                   "model": self.model, "content": [], "stop_reason": None,
                                   "stop_sequence": None,
                                   "usage": anthropic_usage(self.req, 0)}
        return (_event("message_start", {"type": "message_start", "message": message})
                + _event("content_block_start", {"type": "content_block_start", "index": 0,
                                                 "content_block": {"type": "text",
                                                                   "text": ""}}))

    def take(self) -> bytes:
        req = self.req
        n = req.generated
        out = [_event("content_block_delta", {
            "type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": output_token(req.text_seed, i)}})
            for i in range(self.sent, n)]
        self.sent = n
        if req.done:
            out.append(_event("content_block_stop", {"type": "content_block_stop",
                                                     "index": 0}))
            out.append(_event("message_delta", {
                "type": "message_delta",
                "delta": {"stop_reason": _STOP.get(req.finish_reason or "", "end_turn"),
                          "stop_sequence": None},
                "usage": anthropic_usage(req, n)}))
            out.append(_event("message_stop", {"type": "message_stop"}))
        return b"".join(out)


# -- vLLM /inference/v1/generate -------------------------------------------------------------------


def _token_ids(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise ApiError(400, f"'{name}' must be a non-empty list of non-negative integers")
    return value


class VllmGenerateApi:
    """vLLM's ``/inference/v1/generate``: ``token_ids`` and ``sampling_params`` required,
    ``model`` optional; the answer is ``{request_id, choices: [{index, logprobs,
    finish_reason, token_ids}], prompt_logprobs, kv_transfer_params}`` (no usage);
    streamed, one ``data:`` chunk of ``token_ids`` per token, a ``usage`` chunk with
    ``stream_options.include_usage``, then ``[DONE]``."""

    def parse(self, raw: bytes) -> ParsedRequest:
        body = json_object(raw)
        ids = _token_ids(body.get("token_ids"), "token_ids")
        sp = body.get("sampling_params")
        if not isinstance(sp, dict):
            raise ApiError(400, "'sampling_params' is required and must be an object")
        stream = _flag(body, "stream")
        opts = body.get("stream_options")
        if opts is not None and not isinstance(opts, dict):
            raise ApiError(400, "'stream_options' must be an object")
        salt = body.get("cache_salt") or ""
        if not isinstance(salt, str):
            raise ApiError(400, "'cache_salt' must be a string")
        kv = body.get("kv_transfer_params")
        if kv is not None and not isinstance(kv, dict):
            raise ApiError(400, "'kv_transfer_params' must be an object")
        rid = body.get("request_id")
        return ParsedRequest(
            chat=False, model=_model(body, required=False), prompt=_prompt_bytes(ids),
            max_tokens=_positive(sp.get("max_tokens"), "sampling_params.max_tokens"),
            stream=stream, include_usage=bool((opts or {}).get("include_usage")),
            cache_salt=salt, kv_transfer_params=kv,
            request_id=rid if isinstance(rid, str) and rid else None)

    def new_id(self, request_id: str | None) -> str:
        return request_id or str(uuid.uuid4())

    def full(self, req: SimRequest, *, model: str, rid: str,
             kv_transfer_params: dict[str, Any] | None) -> bytes:
        return orjson.dumps({
            "request_id": rid,
            "choices": [{"index": 0, "logprobs": None, "finish_reason": req.finish_reason,
                         "token_ids": [token_id(req, i) for i in range(req.generated)]}],
            "prompt_logprobs": None, "kv_transfer_params": kv_transfer_params})

    def writer(self, req: SimRequest, *, model: str, rid: str, include_usage: bool) -> Writer:
        return GenerateWriter(req, rid=rid, include_usage=include_usage)

    def error(self, exc: ApiError) -> bytes:
        return exc.body()


class GenerateWriter:
    """vLLM generate's SSE stream."""

    def __init__(self, req: SimRequest, *, rid: str, include_usage: bool) -> None:
        self.req, self.include_usage = req, include_usage
        self._head = b'data: {"request_id":' + orjson.dumps(rid) + b',"choices":'
        self.sent = 0

    def preamble(self) -> bytes:
        return b""

    def take(self) -> bytes:
        req = self.req
        n = req.generated
        last = n - 1 if req.done else n
        out = []
        for i in range(self.sent, n):
            choice = {"index": 0, "logprobs": None,
                      "finish_reason": req.finish_reason if i == last else None,
                      "token_ids": [token_id(req, i)]}
            out.append(self._head + orjson.dumps([choice]) + b"}\n\n")
        self.sent = n
        if req.done:
            if self.include_usage:
                out.append(self._head + b'[],"usage":' + orjson.dumps(usage(req)) + b"}\n\n")
            out.append(b"data: [DONE]\n\n")
        return b"".join(out)


# -- SGLang /generate ------------------------------------------------------------------------------


def _sglang_meta(req: SimRequest, rid: str, n: int, done: bool) -> dict[str, Any]:
    reason: dict[str, Any] | None = None
    if done:
        reason = ({"type": "length", "length": n} if req.finish_reason == "length"
                  else {"type": "stop", "matched": None})
    return {"id": rid, "finish_reason": reason, "prompt_tokens": req.prompt_tokens,
            "completion_tokens": n, "cached_tokens": req.cached_tokens}


class SglangGenerateApi:
    """SGLang's ``/generate``: ``text`` or ``input_ids`` (one of them), ``sampling_params``
    (``max_new_tokens``), ``stream``, ``rid``; no ``model`` (a server serves one). The answer
    is ``{text, output_ids, meta_info: {id, finish_reason, prompt_tokens,
    completion_tokens, cached_tokens}}``; streamed, each ``data:`` chunk carries the text so
    far (SGLang's default), then ``[DONE]``. One prompt per request here (SGLang also takes
    batches)."""

    def parse(self, raw: bytes) -> ParsedRequest:
        body = json_object(raw)
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            raise ApiError(400, "Either text or input_ids should be provided.")
        if ids is not None:
            prompt = _prompt_bytes(_token_ids(ids, "input_ids"))
        elif isinstance(text, str):
            prompt = text.encode()
        else:
            raise ApiError(400, "'text' must be a string")
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise ApiError(400, "'sampling_params' must be an object")
        rid = body.get("rid")
        return ParsedRequest(
            chat=False, model="", prompt=prompt,
            max_tokens=_positive(sp.get("max_new_tokens"), "sampling_params.max_new_tokens"),
            stream=_flag(body, "stream"), include_usage=True, cache_salt="",
            request_id=rid if isinstance(rid, str) and rid else None)

    def new_id(self, request_id: str | None) -> str:
        return request_id or uuid.uuid4().hex

    def full(self, req: SimRequest, *, model: str, rid: str,
             kv_transfer_params: dict[str, Any] | None) -> bytes:
        n = req.generated
        return orjson.dumps({"text": output_text(req),
                             "output_ids": [token_id(req, i) for i in range(n)],
                             "meta_info": _sglang_meta(req, rid, n, True)})

    def writer(self, req: SimRequest, *, model: str, rid: str, include_usage: bool) -> Writer:
        return SglangWriter(req, rid=rid)

    def error(self, exc: ApiError) -> bytes:
        return orjson.dumps({"error": {"message": exc.message, "code": exc.status}})


class SglangWriter:
    """SGLang's SSE stream: one chunk per token with the text so far."""

    def __init__(self, req: SimRequest, *, rid: str) -> None:
        self.req, self.rid = req, rid
        self.sent = 0

    def preamble(self) -> bytes:
        return b""

    def take(self) -> bytes:
        req = self.req
        n = req.generated
        out = []
        for i in range(self.sent, n):
            done = req.done and i == n - 1
            out.append(b"data: " + orjson.dumps({
                "text": output_text(req, 0, i + 1),
                "meta_info": _sglang_meta(req, self.rid, i + 1, done)}) + b"\n\n")
        self.sent = n
        if req.done:
            out.append(b"data: [DONE]\n\n")
        return b"".join(out)


def count_tokens_body(raw: bytes) -> dict[str, Any]:
    """``/v1/messages/count_tokens``'s body, checked as a Messages body (without
    ``max_tokens``)."""
    body = json_object(raw)
    _model(body, required=True)
    messages_prompt(body)
    return body


__all__ = ["AnthropicApi", "Api", "OpenAIApi", "SglangGenerateApi", "VllmGenerateApi",
           "count_tokens_body", "messages_prompt", "token_id"]
