"""What every EPP plugin factory gets: the pool, a datastore view, the settings the flags
chose, the state store replicas share, and the other plugins by name
(:class:`shared.plugins.Handle`)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from epp.datastore import Datastore, Pool
from epp.metrics.scraper import ScraperConfig
from epp.statestore import MemoryStateStore, StateStore
from shared.plugins import Handle


@dataclass(frozen=True, slots=True)
class Settings:
    """Flag-given settings of one EPP (defaults = the flags' defaults)."""

    #: ``--reject-unknown-models``: 404 for a model no rewrite, legacy model or server names.
    reject_unknown_models: bool = False
    #: Honour the proxy's ``envoy.lb.subset_hint`` (``--disable-endpoint-subset-filter``).
    subset_filter: bool = True
    #: ``--metrics-staleness-threshold``: older metrics make an endpoint a second choice.
    staleness: float = 2.0
    #: Defaults of ``metrics-data-source`` from the ``--model-server-metrics-*`` and
    #: ``--refresh-metrics-interval`` flags.
    scraper: ScraperConfig = field(default_factory=ScraperConfig)
    #: ``--session-token-key-file``: the HMAC key of ``session-affinity-scorer`` tokens
    #: (None: a random key per process, so tokens do not survive a restart).
    session_token_key: bytes | None = None
    #: The deprecated ``--total-queued-requests-metric`` & co.: metric specifications
    #: replacing families of the default engine's dialect (keys ``queued``, ``running``,
    #: ``kv_usage``, ``lora``, ``cache_info``).
    metric_overrides: Mapping[str, str] = field(default_factory=dict)
    #: ``--emit-endpoint-scores``: the primary profile's per-endpoint total scores go to
    #: the proxy in ``envoy.lb`` → ``x-gateway-destination-endpoint-scores``.
    emit_endpoint_scores: bool = False


class EppHandle(Handle):
    """The EPP's handle. ``datastore`` is live: read ``datastore.snapshot`` (immutable) or
    the endpoint views, never keep a snapshot across requests.

    ``state_store`` is what active-active replicas share (``--state-store``; a private
    in-memory store otherwise). A plugin whose state should follow the pool rather than this
    replica keeps it there; its request-path methods never wait on the network.
    """

    def __init__(self, datastore: Datastore | None = None,
                 settings: Settings | None = None,
                 state_store: StateStore | None = None,
                 rng: random.Random | None = None) -> None:
        super().__init__(rng)
        self.datastore = datastore if datastore is not None else Datastore()
        self.settings = settings or Settings()
        self.state_store = state_store if state_store is not None else MemoryStateStore()

    @property
    def pool(self) -> Pool | None:
        """The InferencePool as of the latest snapshot (None before it is known)."""
        return self.datastore.snapshot.pool
