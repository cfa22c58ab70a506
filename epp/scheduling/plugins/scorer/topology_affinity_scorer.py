"""``topology-affinity-scorer`` (llm-d-router v0.10): in the second stage of a disaggregated
request, prefer candidates close to the first stage's pick (KV-cache transfer path)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epp.datalayer.topology import Level, compare, peer_topology, resolve_producer, topology_of
from epp.datastore import EndpointView
from epp.scheduling.plugin import Scorer
from epp.scheduling.request import LLMRequest
from shared.plugins import Handle

#: Upstream's fixed curve, shaped by transfer bandwidth (NVLink ≫ one switch ≫ several hops
#: ≫ inter-datacenter), not evenly spaced.
LEVEL_SCORES = {Level.HOST: 1.0, Level.RACK: 0.2, Level.ZONE: 0.05, Level.REGION: 0.02,
                Level.NONE: 0.0}


@dataclass(frozen=True, slots=True)
class TopologyAffinityScorerParameters:
    """``topologyProducerName``: the ``topology-extractor`` to read (default the config's)."""

    topology_producer_name: str = ""


class TopologyAffinityScorer(Scorer):
    """score(e) = 1.00 same host, 0.20 same rack, 0.05 same zone, 0.02 same region, 0 else
    (the tightest level shared with the peer pick; a missing value never matches). Every
    candidate scores 0 when there is no peer topology."""

    type_name = "topology-affinity-scorer"
    parameters_type = TopologyAffinityScorerParameters
    params: TopologyAffinityScorerParameters
    bounded = True

    def __init__(self, name: str = "", params: Any = None, producer: str = "") -> None:
        super().__init__(name, params)
        self.producer = producer or self.params.topology_producer_name

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> TopologyAffinityScorer:
        return cls(name, params, resolve_producer(params.topology_producer_name, handle, name))

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        peer = peer_topology(request.plugin_state, self.producer)
        if peer is None:
            return [0.0] * len(endpoints)
        return [LEVEL_SCORES[compare(peer, topology_of(v, self.producer))] for v in endpoints]
