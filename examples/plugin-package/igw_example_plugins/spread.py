"""``pick-counter`` and ``fewest-picks-scorer``: spread requests by how often this EPP has
already sent one to each endpoint.

The scorer does not keep its own counts: its factory finds the counter by name through the
handle (parameter ``counter``), which is how plugins share data without globals.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import PreRequest
from epp.scheduling import EndpointsRemoved, LLMRequest, Plugin, SchedulingResult, Scorer
from shared.plugins import Handle


class PickCounter(Plugin, PreRequest, EndpointsRemoved):
    """Counts the requests sent to each endpoint (after the pick, before the request goes)."""

    type_name = "pick-counter"

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)
        self.picks: Counter[str] = Counter()

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self.picks[result.endpoints[0].key] += 1

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        for key in set(self.picks) - keys:
            del self.picks[key]


@dataclass(frozen=True, slots=True)
class FewestPicksParameters:
    """``counter``: the name of the ``pick-counter`` plugin to read."""

    counter: str = "pick-counter"


class FewestPicksScorer(Scorer):
    """score = 1 - picks(e) / max picks over the candidates (1 for all when none yet)."""

    type_name = "fewest-picks-scorer"
    parameters_type = FewestPicksParameters
    bounded = True

    def __init__(self, name: str, params: FewestPicksParameters, counter: PickCounter) -> None:
        super().__init__(name, params)
        self.counter = counter

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> FewestPicksScorer:
        return cls(name, params, handle.plugin(params.counter, PickCounter))

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        picks = [self.counter.picks[v.key] for v in endpoints]
        top = max(picks, default=0)
        return [1.0 - p / top if top else 1.0 for p in picks]
