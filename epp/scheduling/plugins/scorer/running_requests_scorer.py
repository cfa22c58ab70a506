"""``running-requests-size-scorer``: prefer the endpoint running the fewest requests."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest


class RunningRequestsSizeScorer(Scorer):
    """score = (maxR - r) / (maxR - minR) over the candidates; all equal -> 1.

    ``r`` is the scraped number of running requests.
    """

    type_name = "running-requests-size-scorer"
    bounded = True

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        rs = [v.metrics.running for v in endpoints]
        lo, hi = min(rs), max(rs)
        if hi == lo:
            return [1.0] * len(rs)
        span = hi - lo
        return [(hi - r) / span for r in rs]
