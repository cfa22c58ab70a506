"""``token-load-scorer``: prefer the endpoint with the fewest in-flight tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest


@dataclass(frozen=True, slots=True)
class TokenLoadParameters:
    """``maxInflightTokens``: the load at which the score reaches 0."""

    max_inflight_tokens: int = 4_194_304


class TokenLoadScorer(Scorer):
    """score = 1 - min(inflightTokens, max) / max, max = 4,194,304 by default.

    ``inflightTokens`` is the EPP's own count of estimated prompt tokens routed to the
    endpoint and not yet finished.
    """

    type_name = "token-load-scorer"
    parameters_type = TokenLoadParameters
    bounded = True
    params: TokenLoadParameters

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        cap = self.params.max_inflight_tokens
        if cap <= 0:
            return [1.0] * len(endpoints)
        return [1.0 - min(v.inflight_tokens, cap) / cap for v in endpoints]
