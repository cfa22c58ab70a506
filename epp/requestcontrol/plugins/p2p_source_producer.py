"""``p2p-source-producer`` (llm-d-router v0.10): name a pod that holds more of the prompt's
prefix in cache than the pod about to compute it, in ``x-kv-cache-source-host-port``, so the
routing sidecar has that pod's cache pulled over the P2P tier instead of recomputing it.

Reads the per-endpoint prefix match of ``prefixMatchInfoProducerName`` (an
``approx-prefix-cache-producer``, or a ``precise-prefix-cache-scorer`` whose index the KV
events fill; default: the config's approximate producer, else its precise scorer).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from epp.datastore import EndpointView
from epp.requestcontrol.plugin import DataProducer, PreRequest
from epp.scheduling.plugin import Plugin
from epp.scheduling.plugins.prefix.precise_prefix_cache_scorer import PrecisePrefixCacheScorer
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from epp.scheduling.request import LLMRequest
from epp.scheduling.result import SchedulingResult
from modelserver.pd import KV_SOURCE_HEADER
from shared.plugins import Handle, PluginError

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class P2PSourceParameters:
    """``prefixMatchInfoProducerName`` (default: the config's prefix producer),
    ``minCachedTokenDelta`` (1, ≥ 1), ``prefillProfileName`` (``prefill``)."""

    prefix_match_info_producer_name: str = ""
    min_cached_token_delta: int = 1
    prefill_profile_name: str = "prefill"

    def __post_init__(self) -> None:
        if self.min_cached_token_delta < 1:
            raise ValueError(f"minCachedTokenDelta must be >= 1, got "
                             f"{self.min_cached_token_delta}")


def sampling_coordinate(request_id: str) -> float:
    """A stable number in [0, 1) from the request id (spreads pulls, reproducibly)."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class P2PSourceProducer(Plugin, DataProducer, PreRequest):
    """cached(e) = prompt tokens e holds (matched blocks * tokens per block). Band = the
    endpoints with cached(e) ≥ max cached - one block (and > 0); the source is drawn from the
    band with weights 1 / (1 + waiting queue(e)) at the request id's hash. After the pick:
    computing pod c = the ``prefillProfileName`` profile's pick, else the primary pick; the
    header is set when source ≠ c and cached(source) - cached(c) ≥ ``minCachedTokenDelta``.
    An inbound copy of the header is always removed (by the director)."""

    type_name = "p2p-source-producer"
    parameters_type = P2PSourceParameters
    params: P2PSourceParameters

    def __init__(self, name: str = "", params: Any = None, handle: Handle | None = None,
                 ) -> None:
        super().__init__(name, params)
        self._handle = handle
        self._source: ApproxPrefixCacheProducer | PrecisePrefixCacheScorer | None = None

    @classmethod
    def create(cls, name: str, params: Any, handle: Handle) -> P2PSourceProducer:
        return cls(name, params, handle)

    def source(self) -> ApproxPrefixCacheProducer | PrecisePrefixCacheScorer:
        """The prefix-match producer read (found on first use: the scorers that add their
        own producer are built after the data producers)."""
        if self._source is None:
            handle = self._handle
            wanted = self.params.prefix_match_info_producer_name
            if handle is None:
                raise PluginError("p2p-source-producer has no handle to find its producer")
            if wanted:
                found = handle.plugin(wanted, Plugin)
                if not isinstance(found, ApproxPrefixCacheProducer | PrecisePrefixCacheScorer):
                    raise PluginError(f"prefixMatchInfoProducerName: {wanted!r} is a "
                                      f"{found.type_name}, not a prefix-cache producer")
                self._source = found
            else:
                approx = handle.find(ApproxPrefixCacheProducer)
                precise = handle.find(PrecisePrefixCacheScorer)
                if not (approx or precise):
                    raise PluginError("no prefix-cache producer in the config to read")
                self._source = approx[0] if approx else precise[0]
        return self._source

    def check(self) -> None:
        """Raise PluginError when the producer cannot be found (the config builder calls it
        once every plugin exists)."""
        self.source()

    def cached_tokens(self, request: LLMRequest) -> dict[str, int]:
        """Prompt tokens each endpoint holds in cache, by endpoint key."""
        src = self.source()
        if isinstance(src, ApproxPrefixCacheProducer):
            per_block = src.tokens_per_block
            return {k: n * per_block for k, n in src.match(request).matched.items()}
        state = request.plugin_state.get(src.name)
        if not isinstance(state, tuple) or len(state) != 2:
            return {}  # the precise scorer did not score this request (no token ids)
        return {k: n * src.block_size for k, n in state[1].items()}

    def produce(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        # the candidates as they were before any filter: any pool pod may be the source
        request.plugin_state[self.name] = list(endpoints)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        endpoints = request.plugin_state.get(self.name) or [
            v for r in result.results.values() for v in r.candidates]
        cached = self.cached_tokens(request)
        best = max((cached.get(v.key, 0) for v in endpoints), default=0)
        if best <= 0:
            return
        block = self._block_tokens()
        band = [v for v in endpoints if cached.get(v.key, 0) >= max(1, best - block)]
        weights = [1.0 / (1 + v.metrics.waiting) for v in band]
        point = sampling_coordinate(request.request_id) * sum(weights)
        chosen = band[-1]
        for view, w in zip(band, weights, strict=True):
            if point < w:
                chosen = view
                break
            point -= w
        prefill = result.results.get(self.params.prefill_profile_name)
        computing = prefill.picked[0] if prefill is not None and prefill.picked else \
            result.endpoints[0]
        delta = cached.get(chosen.key, 0) - cached.get(computing.key, 0)
        if chosen.key != computing.key and delta >= self.params.min_cached_token_delta:
            result.extra_headers[KV_SOURCE_HEADER] = chosen.key

    def _block_tokens(self) -> int:
        src = self.source()
        if isinstance(src, ApproxPrefixCacheProducer):
            return src.tokens_per_block
        return src.block_size
