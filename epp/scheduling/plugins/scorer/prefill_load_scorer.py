"""``prefill-load-scorer``: prefer the endpoint that would compute the request's prompt
soonest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from epp.scheduling.request import LLMRequest
from shared.plugins import Handle


class PrefillLoadScorer(Scorer):
    """score = (maxW - w) / (maxW - minW) over the candidates; all equal -> 1, where
    w = the endpoint's pending prefill tokens + this request's uncached prompt tokens there.

    Pending prefill (:attr:`EndpointView.prefill_tokens`) is the uncached prompt tokens this
    EPP routed to the endpoint whose first token has not come back. A request's wait for its
    first token is the prompt work ahead of it plus its own, and both are tokens, not
    requests: two short prompts ahead are less wait than one long one, and a prefix-cache hit
    shortens the request's own part. Scraped metrics cannot show this (vLLM's
    ``num_requests_waiting`` counts requests, and a prompt being computed is already
    ``running``), so the count is the EPP's own. The uncached part comes from the
    approximate prefix producer when the config has one (else the whole prompt everywhere).
    """

    type_name = "prefill-load-scorer"
    bounded = True

    def __init__(self, name: str = "", params: Any = None, handle: Handle | None = None) -> None:
        super().__init__(name, params)
        self._handle = handle
        self._prefix: list[ApproxPrefixCacheProducer] | None = None  # looked up once

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> PrefillLoadScorer:
        return cls(name, params, handle)

    def _own(self, request: LLMRequest, view: EndpointView) -> int:
        if self._prefix is None:
            found = self._handle.find(ApproxPrefixCacheProducer) if self._handle else []
            self._prefix = list(found)
        if not self._prefix:
            return request.prompt_tokens
        return self._prefix[0].uncached_tokens(request, view.key)

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        ws = [v.prefill_tokens + self._own(request, v) + 1 for v in endpoints]
        lo = min(ws)
        return [lo / w for w in ws]
