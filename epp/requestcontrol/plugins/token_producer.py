"""``token-producer``: the prompt's token ids for the plugins that read them
(``precise-prefix-cache-scorer``, ``prefix-cache-scorer`` with ``blockSizeTokens``,
``context-length-aware``), llm-d-router v0.10's plugin of the same name.

Backends, as upstream selects them:

- ``estimate`` (default: no ``vllm`` block and no ``modelName``): no tokenizer, no service.
  The prompt bytes (the text for completions, the messages' JSON for chat) are zero-padded to
  a multiple of 4 and read as little-endian uint32 ids, one per 4 bytes (upstream's byte
  packing). The ids are not the engine's: fine for approximate prefix matching and token
  counts, not for correlating with the engine's KV events.
- ``vllm`` (or ``modelName`` alone): vLLM's ``POST {vllm.url}/v1/completions/render`` (body
  ``{model, prompt}``, answer ``[{token_ids}]``) and ``/v1/chat/completions/render`` (body
  ``{model, messages}``, the server applies its chat template; answer ``{token_ids}``), served
  by ``vllm serve`` and ``vllm launch render``, and by the project's simulator.

Asking a server awaits a network call, so the plugin runs at the director's awaitable step (it
is an *admitter* that always admits) rather than among the synchronous data producers; scorers
run after it either way. On failure (server down, timeout, bad answer) the request goes on
without token ids, as in llm-d: the scorers fall back to their own paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
    """``url``: base URL of a server with vLLM's ``/render`` endpoints for the same model
    (default ``http://localhost:8000``; ``http`` is the older llm-d spelling);
    ``timeout`` 5s; ``mmTimeout`` 30s (multimodal requests, not read here)."""

    url: str = ""
    http: str = ""
    timeout: Duration = _FIVE_SECONDS
    mm_timeout: Duration = _THIRTY_SECONDS

    def __post_init__(self) -> None:
        for key, value in (("url", self.url), ("http", self.http)):
            if value and not value.startswith(("http://", "https://")):
                raise ValueError(f"vllm.{key}: must be an http(s) URL, got {value!r}")
        if self.url and self.http:
            raise ValueError("vllm: give url or its older name http, not both")
        if self.timeout <= 0:
            raise ValueError("vllm.timeout: must be > 0")

    @property
    def base_url(self) -> str:
        """Where the render endpoints are."""
        return (self.url or self.http or "http://localhost:8000").rstrip("/")


@dataclass(frozen=True, slots=True)
class EstimateBackend:
    """``estimate``: upstream's knobs are for image and video placeholders only; multimodal
    requests are not estimated here, so they are refused rather than ignored."""

    image: dict[str, Any] | None = None
    video: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.image or self.video:
            raise ValueError("estimate.image / estimate.video: multimodal placeholder "
                             "estimation is not built (multimodal is its own issue); remove them")


@dataclass(frozen=True, slots=True)
class TokenProducerParameters:
    """llm-d-router v0.10's ``modelName`` (required for ``vllm``), ``vllm`` and ``estimate``
    blocks; neither backend given → ``estimate``."""

    model_name: str = ""
    vllm: VllmBackend | None = None
    estimate: EstimateBackend | None = None

    def __post_init__(self) -> None:
        if self.vllm is not None and self.estimate is not None:
            raise ValueError("give one backend: vllm or estimate")
        if self.vllm is not None and not self.model_name:
            raise ValueError("modelName: required with the vllm backend (the model whose "
                             "tokenizer renders the prompt)")
        if self.estimate is not None and self.model_name:
            raise ValueError("modelName: the estimate backend uses no model; remove it")

    @property
    def backend(self) -> str:
        """``vllm`` or ``estimate``."""
        return "vllm" if self.vllm is not None or self.model_name else "estimate"


BYTES_PER_TOKEN = 4


def pack_bytes(raw: bytes) -> list[int]:
    """Upstream's tokenizer-free ids: ``raw`` zero-padded to 4-byte words, little-endian."""
    if rest := len(raw) % BYTES_PER_TOKEN:
        raw += b"\0" * (BYTES_PER_TOKEN - rest)
    return [int.from_bytes(raw[i:i + BYTES_PER_TOKEN], "little")
            for i in range(0, len(raw), BYTES_PER_TOKEN)]


class TokenProducer(Plugin, Admitter):
    """See the module docstring."""

    type_name = "token-producer"
    parameters_type = TokenProducerParameters
    params: TokenProducerParameters

    def __init__(self, name: str = "", params: TokenProducerParameters | None = None) -> None:
        super().__init__(name, params)
        self._session: aiohttp.ClientSession | None = None
        self.failures = 0
        self.vllm = self.params.vllm or VllmBackend()
        self.url = self.vllm.base_url

    def admit(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Any:
        if request.prompt_token_ids is not None:  # an earlier producer made them
            return None
        if self.params.backend == "estimate":
            tokens = pack_bytes(request.prompt)
            request.prompt_token_ids = tokens
            request.prompt_tokens = len(tokens)
            return None
        return self._tokenize(request)

    def render(self, request: LLMRequest) -> tuple[str, dict[str, Any]]:
        """The render endpoint and body for ``request`` (chat: its messages, else the
        prompt)."""
        path = request.headers.get(":path", "")
        if "chat/completions" in path:
            try:
                messages = orjson.loads(request.prompt)
            except orjson.JSONDecodeError:
                messages = None
            if isinstance(messages, list):
                return (f"{self.url}/v1/chat/completions/render",
                        {"model": self.params.model_name, "messages": messages})
        return (f"{self.url}/v1/completions/render",
                {"model": self.params.model_name,
                 "prompt": request.prompt.decode(errors="replace")})

    async def aclose(self) -> None:
        """Close the HTTP session (the EPP keeps it for its lifetime)."""
        if self._session is not None:
            await self._session.close()

    async def _tokenize(self, request: LLMRequest) -> None:
        url, body = self.render(request)
        try:
            session = self._session
            if session is None or session.closed:
                session = self._session = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self.vllm.timeout))
            async with session.post(url, data=orjson.dumps(body),
                                    headers={"content-type": "application/json"}) as resp:
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}")
                answer = orjson.loads(await resp.read())
            if isinstance(answer, list):  # completions: one entry per prompt
                answer = answer[0] if answer else None
            tokens = answer.get("token_ids") if isinstance(answer, dict) else None
            if not isinstance(tokens, list) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in tokens):
                raise ValueError("answer has no list of integer 'token_ids'")
        except (TimeoutError, aiohttp.ClientError, ValueError, OSError) as e:
            self.failures += 1
            if self.failures == 1 or self.failures % 1000 == 0:
                log.warning("token-producer: render failed; scoring without token ids",
                            url=url, error=str(e) or type(e).__name__,
                            failures=self.failures)
            return
        request.prompt_token_ids = tokens
        request.prompt_tokens = len(tokens)


__all__ = ["EstimateBackend", "TokenProducer", "TokenProducerParameters", "VllmBackend",
           "pack_bytes"]
