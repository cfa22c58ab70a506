"""``topology-extractor`` (llm-d-router v0.10): each endpoint's locality (host, rack, zone,
region) from its pod's labels, for ``topology-affinity-filter`` and
``topology-affinity-scorer``.

Fed by ``endpoint-notification-source`` (one is added when the config has none wired to the
extractor, as upstream registers its default source): an endpoint that joins or changes gets
its :class:`Topology` recomputed. Upstream also reads the pod's ``spec.hostname`` when the
hostname label is absent; this EPP's endpoints carry labels only, so set ``hostname`` to a
label your pods have (the default, ``kubernetes.io/hostname``, is a node label that pods
carry only when you copy it onto them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from epp.datalayer.endpoint_events import EndpointEvent, EndpointExtractor, EventKind
from epp.datastore import EndpointView
from epp.scheduling.plugin import Plugin
from shared.plugins import Handle

#: The request attribute (``request.plugin_state`` key) under which ``disagg-profile-handler``
#: publishes the endpoint picked by the stage that ran first, as upstream's ``peer-endpoint``.
PEER_ENDPOINT = "peer-endpoint"


@dataclass(frozen=True, slots=True)
class Topology:
    """Where an endpoint is; "" = unknown (an unknown value never matches)."""

    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""


class Level(enum.IntEnum):
    """How close two endpoints are, tightest first."""

    HOST = 0
    RACK = 1
    ZONE = 2
    REGION = 3
    NONE = 4


def compare(peer: Topology | None, candidate: Topology | None) -> Level:
    """The tightest level ``peer`` and ``candidate`` share (same host implies the rest)."""
    if peer is None or candidate is None:
        return Level.NONE
    for level, a, b in ((Level.HOST, peer.hostname, candidate.hostname),
                        (Level.RACK, peer.rack, candidate.rack),
                        (Level.ZONE, peer.zone, candidate.zone),
                        (Level.REGION, peer.region, candidate.region)):
        if a and a == b:
            return level
    return Level.NONE


@dataclass(frozen=True, slots=True)
class TopologyAttributes:
    """The endpoint's topology as each ``topology-extractor`` (by name) computed it."""

    by_producer: dict[str, Topology]


@dataclass(frozen=True, slots=True)
class TopologyExtractorParameters:
    """The pod labels read for each level (upstream's names and defaults)."""

    hostname: str = "kubernetes.io/hostname"
    rack: str = "topology.kubernetes.io/rack"
    zone: str = "topology.kubernetes.io/zone"
    region: str = "topology.kubernetes.io/region"


class TopologyExtractor(Plugin, EndpointExtractor):
    """topology(e) = (labels[hostname], labels[rack], labels[zone], labels[region]) of e's
    pod; an endpoint with none of the four labels gets no topology."""

    type_name = "topology-extractor"
    parameters_type = TopologyExtractorParameters
    params: TopologyExtractorParameters

    def on_endpoint_event(self, event: EndpointEvent) -> None:
        view = event.view
        if event.kind is EventKind.DELETED or view is None:
            return
        self.install(view)

    def install(self, view: EndpointView) -> None:
        """Compute ``view``'s topology from its labels and store it under this producer."""
        labels, p = view.endpoint.labels, self.params
        topo = Topology(labels.get(p.hostname, ""), labels.get(p.rack, ""),
                        labels.get(p.zone, ""), labels.get(p.region, ""))
        current = view.attribute(TopologyAttributes)
        mine = dict(current.by_producer) if current is not None else {}
        if topo == Topology():
            mine.pop(self.name, None)
        else:
            mine[self.name] = topo
        view.attributes[TopologyAttributes] = TopologyAttributes(mine)


def topology_of(view: EndpointView | None, producer: str) -> Topology | None:
    """``view``'s topology as ``producer`` computed it (None when unknown)."""
    if view is None:
        return None
    attrs = view.attribute(TopologyAttributes)
    return attrs.by_producer.get(producer) if attrs is not None else None


def resolve_producer(name: str, handle: Handle, user: str) -> str:
    """The ``topology-extractor`` a consumer reads: ``name`` (which must be one), else the
    config's first; "" when the config has none (the consumer then fails open, and upstream
    only warns)."""
    if name:
        handle.plugin(name, TopologyExtractor)
        return name
    found = handle.find(TopologyExtractor)
    if not found:
        import structlog

        structlog.get_logger(__name__).warning(
            "no topology-extractor in the config: topology affinity has nothing to read",
            plugin=user)
        return ""
    return found[0].name


def peer_topology(plugin_state: dict[str, Any], producer: str) -> Topology | None:
    """The topology of the endpoint the earlier disaggregation stage picked."""
    peer = plugin_state.get(PEER_ENDPOINT)
    return topology_of(peer if isinstance(peer, EndpointView) else None, producer)


__all__ = ["PEER_ENDPOINT", "Level", "Topology", "TopologyAttributes",
           "TopologyExtractor", "TopologyExtractorParameters", "compare", "peer_topology",
           "resolve_producer", "topology_of"]
