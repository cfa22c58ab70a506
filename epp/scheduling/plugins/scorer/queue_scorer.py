"""``queue-scorer``: prefer the endpoint with the shortest waiting queue."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest


class QueueScorer(Scorer):
    """score = (maxQ - q) / (maxQ - minQ) over the candidates; all equal -> 1.

    ``q`` is :attr:`EndpointView.queue`: the scraped waiting queue plus requests this EPP
    routed to the endpoint since that scrape was sent and that are still in flight, so a
    burst between two scrapes spreads out instead of landing on one endpoint.
    """

    type_name = "queue-scorer"
    bounded = True

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        qs = [v.queue for v in endpoints]
        lo, hi = min(qs), max(qs)
        if hi == lo:
            return [1.0] * len(qs)
        span = hi - lo
        return [(hi - q) / span for q in qs]
