"""``prefill-load-scorer``: prefer the endpoint that would compute the request's prompt
soonest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.plugins.prefix.producer import UncachedTokens
from epp.scheduling.request import LLMRequest
from shared.plugins import Handle


class PrefillLoadScorer(Scorer):
    """score = minW / w over the candidates (1 for the least work, all equal -> 1), where
    w = 1 + the endpoint's pending prefill tokens + this request's uncached prompt tokens
    there. A ratio, not min-max: a small difference between large backlogs scores close
    together, so it does not outvote the prefix scorer's affinity (min-max did: docs/epp.md,
    "The default profile").

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
        self._uncached = UncachedTokens(handle)

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> PrefillLoadScorer:
        return cls(name, params, handle)

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        ws = [v.prefill_tokens + self._uncached(request, v.key) + 1 for v in endpoints]
        lo = min(ws)
        return [lo / w for w in ws]
