"""``topology-affinity-filter`` (llm-d-router v0.10): in the second stage of a disaggregated
request (prefill after decode, or decode after prefill with ``stageOrder: prefill-first``),
keep the candidates co-located with the first stage's pick."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from epp.datalayer.topology import Level, compare, peer_topology, resolve_producer, topology_of
from epp.datastore import EndpointView
from epp.scheduling.plugin import Filter
from epp.scheduling.request import LLMRequest
from shared.plugins import Handle


@dataclass(frozen=True, slots=True)
class TopologyAffinityFilterParameters:
    """``minAffinity`` (``host``): the loosest level still kept; ``topologyProducerName``:
    the ``topology-extractor`` to read (default the config's)."""

    min_affinity: Literal["host", "rack", "zone", "region"] = "host"
    topology_producer_name: str = ""


class TopologyAffinityFilter(Filter):
    """keep e ⇔ level(peer, e) ≤ minAffinity (host < rack < zone < region), where a missing
    value never matches (not even empty against empty) and a candidate without topology is
    dropped. Fails open: no peer topology, or no candidate close enough → every candidate."""

    type_name = "topology-affinity-filter"
    parameters_type = TopologyAffinityFilterParameters
    params: TopologyAffinityFilterParameters

    def __init__(self, name: str = "", params: Any = None, producer: str = "") -> None:
        super().__init__(name, params)
        self.producer = producer or self.params.topology_producer_name
        self.floor = Level[self.params.min_affinity.upper()]

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> TopologyAffinityFilter:
        return cls(name, params, resolve_producer(params.topology_producer_name, handle, name))

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        peer = peer_topology(request.plugin_state, self.producer)
        if peer is None:
            return endpoints
        kept = [v for v in endpoints
                if compare(peer, topology_of(v, self.producer)) <= self.floor]
        return kept or endpoints
