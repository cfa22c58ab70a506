"""``inflight-load-producer``: counts the requests and estimated tokens in flight on each
endpoint (what ``queue``, token-load and concurrency plugins read).

Every profile's first pick counts, as in llm-d: with P/D disaggregation the prefill pick
counts on the prefill endpoint too, so successive prefill picks spread over the prefill
pods and load-aware scorers (``active-request-scorer``, ``token-load-scorer``) see the
prompts they are computing. The primary pick (where the request goes) counts until the
exchange ends; the other profiles' picks (the prefill pick) until the response headers
arrive: the decode pod's sidecar answers only after its prefill leg came back, so by then the
prefill pod has finished the prompt (llm-d releases it at the first response chunk, which
comes a KV pull and a decode step later). An exchange that ends without response headers
releases everything at its end (docs/pd.md).

The same picks also count their uncached prompt tokens as **pending prefill**
(``prefill_tokens``, what ``prefill-load-scorer`` reads) until the prompt has been computed:
on the primary pick until the first streamed token (or the end of a response that is not
streamed), on the other profiles' picks until the response headers. This is this replica's
own count: replicas do not share it.

Every replica counts its own picks on the endpoint views at once. Through the handle's state
store it also publishes them and, with active-active replicas sharing a Valkey
(docs/active-active.md), installs the other replicas' counts on the views as each sync
brings them, so every replica sees the pool's whole in-flight load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epp.datastore import Datastore, EndpointView
from epp.handle import EppHandle
from epp.requestcontrol.plugin import (
    FirstToken,
    PreRequest,
    Response,
    ResponseComplete,
    ResponseReceived,
)
from epp.scheduling.plugin import Plugin
from epp.scheduling.plugins.prefix.producer import UncachedTokens
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from epp.statestore import NO_INFLIGHT, InFlight, MemoryStateStore, StateStore
from shared.plugins import Handle


@dataclass(frozen=True, slots=True)
class InflightLoadParameters:
    """llm-d-router v0.10: ``addEstimatedOutputTokens`` (false) adds an output estimate to the
    primary pick's in-flight tokens: ``min(round(prompt tokens * outputRatio), the client's
    max_tokens / max_completion_tokens / max_output_tokens when given,
    maxEstimatedOutputTokens when set)``; ``outputRatio`` 1.5."""

    add_estimated_output_tokens: bool = False
    output_ratio: float = 1.5
    max_estimated_output_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.output_ratio < 0:
            raise ValueError(f"outputRatio must be non-negative, got {self.output_ratio}")
        if self.max_estimated_output_tokens is not None and self.max_estimated_output_tokens < 0:
            raise ValueError(f"maxEstimatedOutputTokens must be non-negative, got "
                             f"{self.max_estimated_output_tokens}")


class InflightLoadProducer(PreRequest, ResponseReceived, FirstToken, ResponseComplete, Plugin):
    """At the pick: +1 request and +``prompt_tokens`` on the picked endpoint (+ the output
    estimate with ``addEstimatedOutputTokens``) and on each other profile's first pick; at
    the response headers: the other profiles' picks back; at the end of the exchange
    (success, error or broken stream): the primary pick back (and the others if no headers
    came), never below 0.

    Pending prefill: + the prompt tokens not in the endpoint's cache (as far as the
    approximate prefix index knows) at the pick, on the endpoints that compute the prompt
    (the other profiles' picks if any, else the primary pick); back at the response headers
    (other picks), the first token (primary pick) or the end, whichever comes first."""

    type_name = "inflight-load-producer"
    parameters_type = InflightLoadParameters
    params: InflightLoadParameters

    def __init__(self, name: str = "", params: Any = None,
                 store: StateStore | None = None, datastore: Datastore | None = None,
                 handle: EppHandle | None = None) -> None:
        super().__init__(name, params)
        self.store = store if store is not None else MemoryStateStore()
        self.datastore = datastore
        self.uncached_tokens = UncachedTokens(handle)
        if datastore is not None:
            self.store.on_remote_inflight(self.apply_remote)

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> InflightLoadProducer:
        if isinstance(handle, EppHandle):
            return cls(name, params, handle.state_store, handle.datastore, handle)
        return cls(name, params)

    def estimated_output(self, request: LLMRequest) -> int:
        """Output tokens counted in flight on the primary pick (0 unless configured)."""
        p = self.params
        if not p.add_estimated_output_tokens:
            return 0
        estimate = round(request.prompt_tokens * p.output_ratio)
        for cap in (request.max_output_tokens, p.max_estimated_output_tokens):
            if cap is not None:
                estimate = min(estimate, cap)
        return max(0, estimate)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        primary = result.endpoints[0]
        self._start(primary, request, self.estimated_output(request))
        others = [r.picked[0] for name, r in result.results.items()
                  if name != result.primary_profile and r.picked]
        if others:
            request.plugin_state[self.name] = others
            for view in others:
                self._start(view, request)
        prefilling = [(v, self.uncached_tokens(request, v.key)) for v in others or [primary]]
        request.plugin_state[self._prefill_key] = prefilling
        for view, tokens in prefilling:
            view.prefill_tokens += tokens

    def response_received(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        if self.name in request.plugin_state:
            self._release_prefill(request)
        self._release_others(request)

    def first_token(self, request: LLMRequest, response: Response,
                    endpoint: EndpointView) -> None:
        self._release_prefill(request)

    def response_complete(self, request: LLMRequest, response: Response,
                          endpoint: EndpointView) -> None:
        self._release_prefill(request)
        self._release_others(request)
        self._end(endpoint, request, self.estimated_output(request))

    @property
    def _prefill_key(self) -> str:
        return f"{self.name}/prefill"

    def _release_prefill(self, request: LLMRequest) -> None:
        """The pending prefill back, once."""
        for view, tokens in request.plugin_state.pop(self._prefill_key, ()):
            view.prefill_tokens = max(0, view.prefill_tokens - tokens)

    def _start(self, view: EndpointView, request: LLMRequest, extra: int = 0) -> None:
        tokens = request.prompt_tokens + extra
        view.start_request(tokens)
        self.store.add_inflight(view.key, 1, tokens)

    def _end(self, view: EndpointView, request: LLMRequest, extra: int = 0) -> None:
        tokens = request.prompt_tokens + extra
        view.end_request(tokens)
        self.store.add_inflight(view.key, -1, -tokens)

    def _release_others(self, request: LLMRequest) -> None:
        """The non-primary picks (the prefill pick) back, once."""
        for view in request.plugin_state.pop(self.name, ()):
            self._end(view, request)

    def apply_remote(self, remote: Mapping[str, InFlight]) -> None:
        """Install the other replicas' counts on every endpoint view (0 where they have
        none: a replica that finished or died stops counting)."""
        if self.datastore is None:
            return
        for view in self.datastore.views():
            counts = remote.get(view.key, NO_INFLIGHT)
            if counts.requests != view.remote_requests or counts.tokens != view.remote_tokens:
                view.set_remote_inflight(counts.requests, counts.tokens)
