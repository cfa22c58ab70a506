"""``token-producer``: the prompt's token ids, from the model server's tokenizer over HTTP
(llm-d's plugin of the same name, ``vllm.http`` backend).

It sends vLLM's ``POST {vllm.http}/tokenize`` (``prompt`` for completions, ``messages`` for
chat, so the server applies its chat template) and sets ``request.prompt_token_ids``, which
``precise-prefix-cache-scorer`` (and the approximate ``prefix-cache-scorer`` with
``blockSizeTokens``) read. llm-d calls vLLM's ``/v1/*/render`` endpoints instead; ``/tokenize``
gives the same ids and is what the project's simulator serves.

Tokenizing awaits a network call, so the plugin runs at the director's awaitable step (it is
an *admitter* that always admits) rather than among the synchronous data producers; scorers
run after it either way. On failure (server down, timeout, bad answer) the request goes on
without token ids, as in llm-d: the scorers fall back to their own paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import structlog

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import Admitter
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest
from shared.plugins import Duration

log = structlog.get_logger(__name__)

_FIVE_SECONDS = Duration(5.0)
_THIRTY_SECONDS = Duration(30.0)


@dataclass(frozen=True, slots=True)
class VllmBackend:
    """``http``: base URL of a server with vLLM's ``/tokenize`` for the same model."""

    http: str = "http://localhost:8000"
    timeout: Duration = _FIVE_SECONDS
    #: Accepted for llm-d configs: there are no multimodal requests to tokenize here.
    mm_timeout: Duration = _THIRTY_SECONDS

    def __post_init__(self) -> None:
        if not self.http.startswith(("http://", "https://")):
            raise ValueError(f"vllm.http: must be an http(s) URL, got {self.http!r}")
        if self.timeout <= 0:
            raise ValueError("vllm.timeout: must be > 0")


@dataclass(frozen=True, slots=True)
class TokenProducerParameters:
    """llm-d's ``modelName`` (required) and ``vllm`` block."""

    model_name: str = ""
    vllm: VllmBackend = field(default_factory=VllmBackend)

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("modelName: required (the model whose tokenizer is asked)")


class TokenProducer(Plugin, Admitter):
    """See the module docstring."""

    type_name = "token-producer"
    parameters_type = TokenProducerParameters
    params: TokenProducerParameters

    def __init__(self, name: str = "", params: TokenProducerParameters | None = None) -> None:
        super().__init__(name, params)
        self._session: aiohttp.ClientSession | None = None
        self.failures = 0
        self.url = self.params.vllm.http.rstrip("/") + "/tokenize"

    def admit(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Any:
        if request.prompt_token_ids is not None:  # an earlier producer made them
            return None
        return self._tokenize(request)

    def body(self, request: LLMRequest) -> dict[str, Any]:
        """The ``/tokenize`` body for ``request`` (chat: its messages, else the prompt)."""
        path = request.headers.get(":path", "")
        if "chat/completions" in path:
            try:
                messages = orjson.loads(request.prompt)
            except orjson.JSONDecodeError:
                messages = None
            if isinstance(messages, list):
                return {"model": self.params.model_name, "messages": messages}
        return {"model": self.params.model_name,
                "prompt": request.prompt.decode(errors="replace")}

    async def aclose(self) -> None:
        """Close the HTTP session (the EPP keeps it for its lifetime)."""
        if self._session is not None:
            await self._session.close()

    async def _tokenize(self, request: LLMRequest) -> None:
        try:
            session = self._session
            if session is None or session.closed:
                session = self._session = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self.params.vllm.timeout))
            async with session.post(self.url, data=orjson.dumps(self.body(request)),
                                    headers={"content-type": "application/json"}) as resp:
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}")
                answer = orjson.loads(await resp.read())
            tokens = answer.get("tokens") if isinstance(answer, dict) else None
            if not isinstance(tokens, list) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in tokens):
                raise ValueError("answer has no list of integer 'tokens'")
        except (TimeoutError, aiohttp.ClientError, ValueError, OSError) as e:
            self.failures += 1
            if self.failures == 1 or self.failures % 1000 == 0:
                log.warning("token-producer: tokenize failed; scoring without token ids",
                            url=self.url, error=str(e) or type(e).__name__,
                            failures=self.failures)
            return
        request.prompt_token_ids = tokens
        request.prompt_tokens = len(tokens)


__all__ = ["TokenProducer", "TokenProducerParameters"]
