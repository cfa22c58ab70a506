"""The response on its way back: ``model`` renamed to what the client asked for, and token
usage read, from JSON bodies and from SSE streams alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


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
        if isinstance(usage, dict):
            self.raw = usage
            p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(p, int):
                self.prompt_tokens = p
            if isinstance(c, int):
                self.completion_tokens = c
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(
                    cached := details.get("cached_tokens"), int):
                self.cached_tokens = cached


class ResponseRewriter:
    """Rewrites one response. SSE chunks are processed line by line; a line cut across two
    chunks is held back until its end arrives (an SSE event is not usable before that)."""

    __slots__ = ("_carry", "_from", "_to", "client_model", "first_token_seen", "target_model",
                 "usage")

    def __init__(self, client_model: str, target_model: str) -> None:
        self.client_model = client_model
        self.target_model = target_model
        self.usage = Usage()
        self.first_token_seen = False
        self._carry = b""
        # The servers we front write compact JSON; a rename is then a plain byte replace.
        self._from = b'"model":' + orjson.dumps(target_model)
        self._to = b'"model":' + orjson.dumps(client_model)

    @property
    def renames(self) -> bool:
        return self.client_model != self.target_model

    def body(self, body: bytes) -> bytes:
        """A whole JSON response body."""
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body  # not JSON (an error page): pass it on untouched
        if not isinstance(data, dict):
            return body
        self.usage.read(data.get("usage"))
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
        if b'"usage":{' in complete:
            self._read_usage(complete)
        if self.renames and self._from in complete:
            complete = complete.replace(self._from, self._to)
        return complete

    def _read_usage(self, lines: bytes) -> None:
        for line in lines.split(b"\n"):
            if line.startswith(b"data:") and b'"usage":{' in line:
                try:
                    event = orjson.loads(line[5:])
                except orjson.JSONDecodeError:
                    continue
                if isinstance(event, dict):
                    self.usage.read(event.get("usage"))
