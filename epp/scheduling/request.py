"""What the scheduler is asked: one inference request, reduced to what plugins need."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from modelserver.multimodal import MMItem
    from shared.tracing import RequestTrace

#: Rough characters per token; upstream's approximate prefix plugin uses the same figure.
CHARS_PER_TOKEN = 4


@dataclass(slots=True)
class LLMRequest:
    """A request as the scheduler sees it.

    ``prompt`` is the byte string prefix hashing runs over: the prompt text for completions,
    ``orjson.dumps(messages)`` for chat (see :func:`prefix_input`). ``lora_adapter`` is the
    adapter the request needs (normally the target model when it is not the base model);
    None means "no adapter", and LoRA plugins then treat every endpoint alike.
    """

    request_id: str
    target_model: str
    client_model: str = ""
    prompt: bytes = b""
    #: Estimated prompt tokens (see :func:`estimate_tokens`); feeds token-based plugins.
    prompt_tokens: int = 0
    priority: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    lora_adapter: str | None = None
    #: Optional ``cache_salt`` from the body: separates prefix-cache namespaces.
    cache_salt: str = ""
    #: Token ids when the caller has them; prefix hashing then works on exact token blocks.
    prompt_token_ids: Sequence[int] | None = None
    objective: str | None = None
    #: Bytes of the request body as the client sent it.
    request_size: int = 0
    #: The client asked for a streamed response (``"stream": true``).
    stream: bool = False
    #: The client's output cap (``max_tokens``, ``max_completion_tokens`` or
    #: ``max_output_tokens``), None when it set none.
    max_output_tokens: int | None = None
    #: Multimodal items of chat content (images, video, audio), in order
    #: (:func:`modelserver.multimodal.mm_items`); empty for text-only requests.
    mm_items: tuple[MMItem, ...] = ()
    #: Typed data plugins pass to each other within one scheduling cycle, keyed by plugin name.
    plugin_state: dict[str, Any] = field(default_factory=dict)
    #: The request's trace when it is sampled (:mod:`shared.tracing`); None otherwise, and
    #: then nothing builds a span for it.
    trace: RequestTrace | None = None

    @property
    def sheddable(self) -> bool:
        """Negative priority: the first to be dropped under saturation."""
        return self.priority < 0


def prefix_input(prompt: Any = None, messages: Sequence[Any] | None = None) -> bytes:
    """The bytes prefix hashing reads: chat messages as JSON, else the prompt text.

    A list prompt (batched completions) is joined; anything else is JSON-encoded, so the
    same body always gives the same bytes.
    """
    if messages is not None:
        return orjson.dumps(messages)
    if isinstance(prompt, str):
        return prompt.encode()
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt).encode()
    if prompt is None:
        return b""
    return orjson.dumps(prompt)


def max_output_tokens(body: Mapping[str, Any]) -> int | None:
    """The output cap a request body sets, whichever API's spelling it uses (None if none)."""
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens", "max_new_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def estimate_tokens(prompt: bytes) -> int:
    """Estimated prompt tokens from its size (about 4 bytes per token)."""
    return (len(prompt) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
