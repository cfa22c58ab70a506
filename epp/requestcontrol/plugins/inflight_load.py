"""``inflight-load-producer``: counts the requests and estimated tokens in flight on each
endpoint (what ``queue``, token-load and concurrency plugins read).

Every replica counts its own picks on the endpoint views at once. Through the handle's state
store it also publishes them and, with active-active replicas sharing a Valkey
(docs/active-active.md), installs the other replicas' counts on the views as each sync
brings them, so every replica sees the pool's whole in-flight load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.datastore import Datastore, EndpointView
from epp.handle import EppHandle
from epp.requestcontrol.plugin import PreRequest, Response, ResponseComplete
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from epp.statestore import NO_INFLIGHT, InFlight, MemoryStateStore, StateStore
from shared.plugins import Handle


class InflightLoadProducer(PreRequest, ResponseComplete, Plugin):
    """At the pick: +1 request and +``prompt_tokens`` on the picked endpoint; at the end of
    the exchange (success, error or broken stream): the same back, never below 0."""

    type_name = "inflight-load-producer"

    def __init__(self, name: str = "", params: Any = None,
                 store: StateStore | None = None, datastore: Datastore | None = None) -> None:
        super().__init__(name, params)
        self.store = store if store is not None else MemoryStateStore()
        self.datastore = datastore
        if datastore is not None:
            self.store.on_remote_inflight(self.apply_remote)

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> InflightLoadProducer:
        if isinstance(handle, EppHandle):
            return cls(name, params, handle.state_store, handle.datastore)
        return cls(name, params)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        view = result.endpoints[0]
        view.start_request(request.prompt_tokens)
        self.store.add_inflight(view.key, 1, request.prompt_tokens)

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        endpoint.end_request(request.prompt_tokens)
        self.store.add_inflight(endpoint.key, -1, -request.prompt_tokens)

    def apply_remote(self, remote: Mapping[str, InFlight]) -> None:
        """Install the other replicas' counts on every endpoint view (0 where they have
        none: a replica that finished or died stops counting)."""
        if self.datastore is None:
            return
        for view in self.datastore.views():
            counts = remote.get(view.key, NO_INFLIGHT)
            if counts.requests != view.remote_requests or counts.tokens != view.remote_tokens:
                view.set_remote_inflight(counts.requests, counts.tokens)
