"""``no-hit-lru-scorer`` (llm-d): spread requests that no cache can help (cold requests)
over endpoints least recently given one, so that new KV blocks grow evenly across the pool."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import PreRequest
from epp.scheduling.plugin import EndpointsRemoved, SchedulerHooks, Scorer
from epp.scheduling.plugins.prefix.precise_prefix_cache_producer import PrecisePrefixCacheProducer
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from shared.plugins import Handle, Plugin, PluginError

#: The prefill profile's pick is also remembered (as llm-d does for P/D).
PREFILL_PROFILE = "prefill"


@dataclass(frozen=True, slots=True)
class NoHitLRUParameters:
    """``prefixPluginName`` / ``prefixPluginType``: the prefix-cache scorer whose match says
    whether a request is cold; ``prefixMatchInfoProducerName`` (llm-d v0.10): read that
    prefix-cache producer's match instead (approximate or precise); ``lruSize``: endpoints
    remembered."""

    prefix_plugin_name: str = "prefix-cache-scorer"
    prefix_plugin_type: str = "prefix-cache-scorer"
    lru_size: int = 1024
    prefix_match_info_producer_name: str = ""

    def __post_init__(self) -> None:
        if self.lru_size <= 0:
            raise ValueError("lruSize must be > 0")


class NoHitLRUScorer(Scorer, PreRequest, EndpointsRemoved):
    """Warm request (the prefix plugin matched a block on some candidate): 0.5 for all.
    Cold request (or no prefix plugin): n candidates, never-served ones first in candidate
    order, then served ones from least to most recently served; the one at rank r scores
    1 - r/(n - 1) (a single candidate scores 1). After the pick of a cold request, the picked
    endpoint (and the prefill profile's, if any) becomes the most recently served."""

    type_name = "no-hit-lru-scorer"
    parameters_type = NoHitLRUParameters
    bounded: ClassVar[bool] = True
    params: NoHitLRUParameters

    def __init__(self, name: str = "", params: Any = None, handle: Handle | None = None) -> None:
        super().__init__(name, params)
        self._handle = handle
        self._prefix: Any = None
        self._resolved = False
        #: Endpoint keys, least recently served first.
        self.lru: OrderedDict[str, None] = OrderedDict()

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> NoHitLRUScorer:
        return cls(name, params, handle)

    def _prefix_plugin(self) -> Any:
        """The producer whose match says cold or warm (an approximate producer, or a precise
        one), looked up once (it may be created after this one)."""
        if not self._resolved:
            self._resolved = True
            p = self.params
            if self._handle is None:
                return None
            if p.prefix_match_info_producer_name:
                found = self._handle.plugin(p.prefix_match_info_producer_name, Plugin)
                if not isinstance(found, ApproxPrefixCacheProducer | PrecisePrefixCacheProducer):
                    raise PluginError(f"{self.name}: prefixMatchInfoProducerName: plugin "
                                      f"{p.prefix_match_info_producer_name!r} "
                                      f"({found.type_name}) is not a prefix-cache producer")
                self._prefix = found
            elif p.prefix_plugin_name in self._handle:
                found = self._handle.plugin(p.prefix_plugin_name, Plugin)
                if found.type_name != p.prefix_plugin_type:
                    raise PluginError(f"{self.name}: plugin {p.prefix_plugin_name!r} is a "
                                      f"{found.type_name}, not a {p.prefix_plugin_type}")
                self._prefix = getattr(found, "precise", None) or getattr(found, "producer", None)
        return self._prefix

    def attach(self, hooks: SchedulerHooks) -> None:
        """Resolve the prefix plugin at build time (every plugin exists by now), so a wrong
        ``prefixPluginType`` stops the config instead of a request."""
        self._prefix_plugin()

    def is_cold(self, request: LLMRequest, endpoints: Sequence[EndpointView] = ()) -> bool:
        """No candidate holds a block of the request (as far as the prefix producer knows)."""
        producer = self._prefix_plugin()
        if producer is None:
            return True
        if isinstance(producer, PrecisePrefixCacheProducer):
            return not any(f > 0 for f in producer.precise_match(request, endpoints)
                           .fractions.values())
        return not any(n > 0 for n in producer.match(request).matched.values())

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        cold = self.is_cold(request, endpoints)
        request.plugin_state[self.name] = cold
        if not cold:
            return [0.5] * len(endpoints)
        n = len(endpoints)
        if n == 1:
            return [1.0]
        position = {key: i for i, key in enumerate(self.lru)}
        never = [i for i, v in enumerate(endpoints) if v.key not in position]
        scores = [0.0] * n
        for rank, i in enumerate(never):
            scores[i] = 1.0 - rank / (n - 1)
        for i, v in enumerate(endpoints):
            if v.key in position:
                scores[i] = max(0.0, 1.0 - (len(never) + position[v.key]) / (n - 1))
        return scores

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        if request.plugin_state.get(self.name) is not True:
            return
        for profile in (result.primary_profile, PREFILL_PROFILE):
            r = result.results.get(profile)
            if r is not None and r.picked:
                self._touch(r.picked[0].key)

    def _touch(self, key: str) -> None:
        self.lru.pop(key, None)
        self.lru[key] = None
        while len(self.lru) > self.params.lru_size:
            self.lru.popitem(last=False)

    def retain_endpoints(self, keys: frozenset[str]) -> None:
        for key in [k for k in self.lru if k not in keys]:
            del self.lru[key]
