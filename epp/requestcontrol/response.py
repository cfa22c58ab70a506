"""The response on its way back: ``model`` renamed to what the client asked for, and token
usage read, from JSON bodies and from SSE streams alike."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

#: A ``"model"`` key and its string value, in any spacing. A match right after a backslash is
#: not a key (:func:`_escaped`); any other is, never text inside a string.
_MODEL_FIELD = re.compile(rb'"model"\s*:\s*("(?:[^"\\]|\\.)*")')
#: ``"usage": {`` in any spacing (``"usage": null`` carries nothing to read).
_USAGE_FIELD = re.compile(rb'"usage"\s*:\s*\{')


@dataclass(slots=True)
class Usage:
    """Token counts the model server reported (0 when it did not)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: ``prompt_tokens_details.cached_tokens`` (vLLM reports it with prefix caching).
    cached_tokens: int = 0
    #: The ``usage`` object as the server wrote it (for plugins reading other fields).
    raw: dict[str, Any] | None = None

    def read(self, usage: object) -> None:
        """A usage object in OpenAI's names (``prompt_tokens``, ``completion_tokens``,
        ``prompt_tokens_details.cached_tokens``) or Anthropic's (``input_tokens``,
        ``output_tokens``, ``cache_read_input_tokens``); a count it leaves out keeps its
        value (Anthropic streams input and output counts in different events)."""
        if isinstance(usage, dict):
            self.raw = usage
            p = usage.get("prompt_tokens", usage.get("input_tokens"))
            c = usage.get("completion_tokens", usage.get("output_tokens"))
            if isinstance(p, int):
                self.prompt_tokens = p
            if isinstance(c, int):
                self.completion_tokens = c
            details = usage.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else \
                usage.get("cache_read_input_tokens")
            if isinstance(cached, int):
                self.cached_tokens = cached

    def read_event(self, event: dict[str, Any]) -> None:
        """The usage one JSON response or SSE event carries, in any API's place for it:
        ``usage`` (OpenAI, vLLM generate, Anthropic ``message_delta``), ``message.usage``
        (Anthropic ``message_start``) or ``meta_info`` (SGLang ``/generate``)."""
        self.read(event.get("usage"))
        message = event.get("message")
        if isinstance(message, dict):
            self.read(message.get("usage"))
        meta = event.get("meta_info")
        if isinstance(meta, dict):
            self.read(meta)
            if isinstance(cached := meta.get("cached_tokens"), int):
                self.cached_tokens = cached

    def count_generated(self, event: dict[str, Any]) -> None:
        """A vLLM ``/inference/v1/generate`` answer names no usage: its choices' generated
        ``token_ids`` are the completion tokens."""
        choices = event.get("choices")
        if self.raw is None and isinstance(choices, list):
            ids = [c.get("token_ids") for c in choices if isinstance(c, dict)]
            lists = [t for t in ids if isinstance(t, list)]
            if lists and len(lists) == len(ids):
                self.completion_tokens = sum(len(t) for t in lists)


def _escaped(m: re.Match[bytes]) -> bool:
    """True when the match's opening quote is an escaped one, i.e. text inside a string. (A
    real quote after ``\\\\`` would end a string, and a string's end is never followed by
    ``model``: only the escaped case can happen in valid JSON.) Checked here rather than with a
    lookbehind, which would cost the pattern its fast literal search (5x slower)."""
    start = m.start()
    return start > 0 and m.string[start - 1] == 0x5C  # backslash


class ResponseRewriter:
    """Rewrites one response. SSE chunks are processed line by line; a line cut across two
    chunks is held back until its end arrives (an SSE event is not usable before that)."""

    __slots__ = ("_carry", "_client_json", "_from", "_grow", "_spaced", "_target_json", "_to",
                 "client_model", "first_token_seen", "renames", "target_model", "usage")

    def __init__(self, client_model: str, target_model: str) -> None:
        self.client_model = client_model
        self.target_model = target_model
        self.renames = client_model != target_model
        self.usage = Usage()
        self.first_token_seen = False
        self._carry = b""
        # vLLM and most servers write compact JSON: there a rename is a plain byte replace;
        # any other spelling goes through a regular expression (see _rename).
        self._target_json = orjson.dumps(target_model)
        self._client_json = orjson.dumps(client_model)
        self._from = b'"model":' + self._target_json
        self._to = b'"model":' + self._client_json
        self._grow = len(self._to) - len(self._from)
        self._spaced: re.Pattern[bytes] | None = None  # compiled when first needed

    def body(self, body: bytes) -> bytes:
        """A whole JSON response body (any formatting: it is parsed)."""
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body  # not JSON (an error page): pass it on untouched
        if not isinstance(data, dict):
            return body
        self.usage.read_event(data)
        self.usage.count_generated(data)
        if self.renames and data.get("model") == self.target_model:
            data["model"] = self.client_model
            return orjson.dumps(data)
        return body

    def chunk(self, chunk: bytes, end_of_stream: bool) -> bytes:
        """One piece of an SSE stream; returns the complete lines it finished (rewritten)."""
        data = self._carry + chunk if self._carry else chunk
        if end_of_stream:
            self._carry = b""
            complete = data
        else:
            cut = data.rfind(b"\n") + 1
            complete, self._carry = data[:cut], data[cut:]
        if not complete:
            return b""
        if not self.first_token_seen and b"data:" in complete:
            self.first_token_seen = True
        if (b'"usage"' in complete and _USAGE_FIELD.search(complete)) \
                or b'"meta_info"' in complete:
            self._read_usage(complete)
        if self.renames:
            keys = complete.count(b'"model"')
            if keys:
                out = complete.replace(self._from, self._to)
                # The fast path: every key was the compact "model":"<target>". The count of
                # replacements comes from the length change, sparing a scan.
                grow = self._grow
                done = (len(out) - len(complete)) // grow if grow else complete.count(self._from)
                return out if done == keys else self._rename(out)
        return complete

    def _rename(self, lines: bytes) -> bytes:
        """``model`` → the client's name where it names the target, in any JSON spelling.

        Without a backslash in ``lines`` the target can only be written one way, so one
        pattern (any spacing) finds it; otherwise every ``"model"`` value is decoded, which
        covers escapes (``\\/``, ``\\u…``) too. Keys are told from text by
        :data:`_MODEL_FIELD`'s rule; key order and other fields never matter.
        """
        if b"\\" not in lines:
            if self._target_json not in lines:
                return lines
            if self._spaced is None:
                self._spaced = re.compile(rb'("model"\s*:\s*)' + re.escape(self._target_json))
            return self._spaced.sub(self._swap_spaced, lines)
        return _MODEL_FIELD.sub(self._swap, lines)

    def _swap_spaced(self, m: re.Match[bytes]) -> bytes:
        return m.group(0) if _escaped(m) else m.group(1) + self._client_json

    def _swap(self, m: re.Match[bytes]) -> bytes:
        if _escaped(m):
            return m.group(0)
        try:
            value = orjson.loads(m.group(1))
        except orjson.JSONDecodeError:
            return m.group(0)
        if value != self.target_model:
            return m.group(0)
        return m.group(0)[:m.start(1) - m.start(0)] + self._client_json

    def _read_usage(self, lines: bytes) -> None:
        for line in lines.split(b"\n"):
            if line.startswith(b"data:") and (b'"usage"' in line or b'"meta_info"' in line):
                try:
                    event = orjson.loads(line[5:])
                except orjson.JSONDecodeError:
                    continue
                if isinstance(event, dict):
                    self.usage.read_event(event)
