"""``context-length-aware`` (llm-d): route by prompt length to pods labelled with the range
of context lengths they are meant for (``llm-d.ai/context-length-range: "0-2048"``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter, Scorer
from epp.scheduling.request import LLMRequest

DEFAULT_LABEL = "llm-d.ai/context-length-range"
_FALLBACK = 0.3


@dataclass(frozen=True, slots=True)
class ContextLengthParameters:
    """``label``: the pod label holding ``min-max`` (tokens); ``enableFiltering``: also drop
    endpoints whose range does not hold the request."""

    label: str = DEFAULT_LABEL
    enable_filtering: bool = False

    def __post_init__(self) -> None:
        if not self.label:
            raise ValueError("label must be specified")


def parse_range(text: str) -> tuple[int, int] | None:
    """``"0-2048"`` → (0, 2048); None when malformed or min > max."""
    parts = text.split("-")
    if len(parts) != 2:
        return None
    try:
        lo, hi = int(parts[0].strip()), int(parts[1].strip())
    except ValueError:
        return None
    return (lo, hi) if lo <= hi else None


def range_score(tokens: int, lo: int, hi: int) -> float:
    """In range: 0.3 + 0.7·(0.7·w + 0.3·h), w = 1/(1 + width/10,000) favouring narrow
    ranges and h = headroom/width; out of range: 0.3/(1 + distance/1,000)."""
    if lo <= tokens <= hi:
        width = hi - lo
        if width == 0:
            return 1.0
        raw = 0.7 * (1.0 / (1.0 + width / 10000.0)) + 0.3 * ((hi - tokens) / width)
        return _FALLBACK + raw * (1.0 - _FALLBACK)
    distance = tokens - hi if tokens > hi else lo - tokens
    return _FALLBACK / (1.0 + distance / 1000.0)


class ContextLengthAware(Filter, Scorer):
    """Score per endpoint by :func:`range_score` of the request's prompt tokens (estimated
    from its size; the token count a producer set when there is one); 0.5 without the
    label, 0 for a malformed label. As a filter (``enableFiltering``) it drops endpoints
    whose range does not hold the request, and those with a malformed label; unlabelled
    ones stay."""

    type_name = "context-length-aware"
    parameters_type = ContextLengthParameters
    bounded: ClassVar[bool] = True
    params: ContextLengthParameters

    @staticmethod
    def tokens(request: LLMRequest) -> int:
        ids = request.prompt_token_ids
        return len(ids) if ids is not None else request.prompt_tokens

    def filter(self, request: LLMRequest,
               endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        if not self.params.enable_filtering:
            return endpoints
        n = self.tokens(request)
        out = []
        for v in endpoints:
            raw = v.endpoint.labels.get(self.params.label)
            if raw is None:
                out.append(v)
                continue
            r = parse_range(raw)
            if r is not None and r[0] <= n <= r[1]:
                out.append(v)
        return out

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        n = self.tokens(request)
        scores = []
        for v in endpoints:
            raw = v.endpoint.labels.get(self.params.label)
            if raw is None:
                scores.append(0.5)
                continue
            r = parse_range(raw)
            scores.append(0.0 if r is None else range_score(n, *r))
        return scores
