"""One request per native protocol through a running gateway (``make run``'s demo lines):
Anthropic Messages streamed, vLLM's ``/inference/v1/generate`` and SGLang's ``/generate``,
each answered by a pool's simulated vLLM with the client's model name restored."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass
class ProtocolResult:
    """What one protocol's request got back."""

    label: str
    status: int
    pod: str = ""
    #: ``model`` in the answer (the client's name when the EPP rewrote it); "" when the
    #: API's answer names none (vLLM and SGLang generate).
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def line(self) -> str:
        if self.status != 200:
            return f"  {self.label:<34} {self.status or 'no answer'}"
        named = f", answer names {self.model}" if self.model else ""
        return (f"  {self.label:<34} 200 {self.pod}: {self.prompt_tokens} in / "
                f"{self.completion_tokens} out tokens{named}")


def _post(url: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=orjson.dumps(body),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("x-inference-pod", "?"), r.read()
    except urllib.error.HTTPError as err:
        return err.code, "", err.read()
    except OSError:
        return 0, "", b""


def _events(sse: bytes) -> list[dict[str, Any]]:
    out = []
    for line in sse.splitlines():
        if line.startswith(b"data: {"):
            out.append(orjson.loads(line[6:]))
    return out


def anthropic_messages(base: str, model: str) -> ProtocolResult:
    """``POST /v1/messages`` streamed: usage from ``message_start`` and ``message_delta``."""
    status, pod, raw = _post(base + "/v1/messages", {
        "model": model, "max_tokens": 8, "stream": True, "system": "Be brief.",
        "messages": [{"role": "user", "content": "Say hello in Anthropic's API."}]})
    res = ProtocolResult("Anthropic /v1/messages, streamed", status, pod)
    for ev in _events(raw) if status == 200 else ():
        if ev.get("type") == "message_start":
            res.model = ev["message"]["model"]
            res.prompt_tokens = ev["message"]["usage"]["input_tokens"]
        elif ev.get("type") == "message_delta":
            res.completion_tokens = ev["usage"]["output_tokens"]
    return res


def vllm_generate(base: str, model: str) -> ProtocolResult:
    """``POST /inference/v1/generate`` with token ids (vLLM's token-in/token-out API)."""
    ids = list(range(100, 164))
    status, pod, raw = _post(base + "/inference/v1/generate", {
        "model": model, "token_ids": ids, "sampling_params": {"max_tokens": 8}})
    res = ProtocolResult("vLLM /inference/v1/generate", status, pod, prompt_tokens=len(ids))
    if status == 200:
        res.completion_tokens = len(orjson.loads(raw)["choices"][0]["token_ids"])
    return res


def sglang_generate(base: str, model: str) -> ProtocolResult:
    """``POST /generate`` streamed (SGLang's native API). SGLang's body names no model: the
    demo adds ``model`` so that BBR can pick the pool (SGLang ignores the field)."""
    status, pod, raw = _post(base + "/generate", {
        "model": model, "text": "Say hello in SGLang's API.", "stream": True,
        "sampling_params": {"max_new_tokens": 8}})
    res = ProtocolResult("SGLang /generate, streamed", status, pod)
    events = _events(raw) if status == 200 else []
    if events:
        meta = events[-1]["meta_info"]
        res.prompt_tokens, res.completion_tokens = meta["prompt_tokens"], meta["completion_tokens"]
    return res


DEMOS: tuple[Callable[[str, str], ProtocolResult], ...] = (
    anthropic_messages, vllm_generate, sglang_generate)


def protocol_lines(port: int, model: str) -> list[str]:
    """One line per protocol, for ``make run``'s screen."""
    base = f"http://127.0.0.1:{port}"
    return [f"Other protocols, one request each for {model}:",
            *(demo(base, model).line() for demo in DEMOS)]


__all__ = ["DEMOS", "ProtocolResult", "protocol_lines"]
