"""The director: one request's life, top to bottom.

parse → target model (rewrite) → priority (objective) → candidates (subset hint) →
admission (saturation) → schedule → commit (in-flight, prefix index) → headers, metadata and
the rewritten body for Envoy. The response side ends in :meth:`Director.finish`.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

from epp import exported_metrics as m
from epp.datastore import Datastore, EndpointView, Snapshot
from epp.scheduling import LLMRequest, Scheduler, UtilizationDetector, estimate_tokens, prefix_input
from epp.scheduling.scheduler import NoCandidates
from shared.errors import BadRequest, GatewayError, NotFound, TooManyRequests
from shared.extproc import RequestDecision
from shared.openai import parse_request

log = structlog.get_logger(__name__)

DESTINATION = "x-gateway-destination-endpoint"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
LB_NAMESPACE = "envoy.lb"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
REWRITE_HEADER = "x-gateway-model-name-rewrite"
REQUEST_ID = "x-request-id"
#: How long the set of served models (from scraped metrics) is reused.
SERVED_TTL = 0.5


class Shed(TooManyRequests):
    """429: a sheddable request while the pool is saturated."""

    code = "shed"


@dataclass(slots=True)
class Routed:
    """A request the director sent somewhere; what the response side needs to close it."""

    request_id: str
    client_model: str
    target_model: str
    endpoint: EndpointView
    tokens: int
    request_size: int
    started: float = field(default_factory=time.monotonic)


class Director:
    """Routes requests for one pool."""

    def __init__(
        self,
        datastore: Datastore,
        scheduler: Scheduler,
        saturation: UtilizationDetector,
        *,
        reject_unknown_models: bool = False,
        subset_filter: bool = True,
        staleness: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        self.datastore = datastore
        self.scheduler = scheduler
        self.saturation = saturation
        self.reject_unknown_models = reject_unknown_models
        self.subset_filter = subset_filter
        self.staleness = staleness
        self.rng = rng or random.Random()
        self._debug = logging.getLogger().isEnabledFor(logging.DEBUG)
        self._served_cache: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        self._served_until = 0.0

    def route(
        self, headers: Mapping[str, str], body: bytes, filter_metadata: Mapping[str, Any]
    ) -> tuple[RequestDecision, Routed]:
        """Decide where a complete request goes; raises :class:`GatewayError` when it can't."""
        req = parse_request(body, headers.get(":path", "/"))
        snap = self.datastore.snapshot
        res = snap.resolve(
            req.model,
            rng=self.rng,
            rewrite_header=headers.get(REWRITE_HEADER),
            objective_header=headers.get(OBJECTIVE_HEADER),
        )
        if self.reject_unknown_models and not self._known(snap, req.model, res.rewritten):
            raise NotFound(f"model {req.model!r} is not served by this pool")

        candidates = self._candidates(filter_metadata)
        if res.priority < 0 and self.saturation.is_saturated(candidates):
            raise Shed("the pool is saturated; sheddable requests are rejected")

        # orjson reads JSON nested up to 1,024 levels but writes only 255: a body between the
        # two would otherwise raise TypeError past the stream (a 500) - or, for the rewrite,
        # after the endpoint was committed (a leaked in-flight count).
        try:
            prompt = prefix_input(req.prompt, req.messages)
            new_body = None
            if res.target_model != req.model:
                req.body["model"] = res.target_model
                new_body = orjson.dumps(req.body)
        except orjson.JSONEncodeError as e:
            raise BadRequest(f"request body cannot be re-encoded: {e}",
                             code="invalid_body") from None
        tokens = estimate_tokens(prompt)
        request_id = headers.get(REQUEST_ID) or str(uuid.uuid4())
        salt = req.body.get("cache_salt")
        llm = LLMRequest(
            request_id=request_id,
            target_model=res.target_model,
            client_model=req.model,
            prompt=prompt,
            prompt_tokens=tokens,
            priority=res.priority,
            headers=headers,
            lora_adapter=None if self._serves_base(res.target_model) else res.target_model,
            cache_salt=salt if isinstance(salt, str) else "",
            objective=res.objective,
        )
        result = self.scheduler.schedule(llm, candidates)
        self.scheduler.post_pick(llm, result)
        endpoint = result.endpoints[0]
        endpoint.start_request(tokens)
        m.REQUESTS.labels(req.model, res.target_model).inc()
        m.RUNNING.labels(req.model).inc()
        m.REQUEST_SIZES.labels(req.model, res.target_model).observe(len(body))
        if self._debug:
            log.debug("picked", request_id=request_id, model=req.model,
                      target_model=res.target_model, endpoint=result.destination,
                      priority=res.priority, scores=result.primary.scores())

        destination = result.destination
        decision = RequestDecision(
            set_headers={DESTINATION: destination, REQUEST_ID: request_id,
                         **result.extra_headers},
            # A client's own copies of our control headers never reach the proxy's LB.
            remove_headers=[h for h in headers if h.startswith(DESTINATION) and h != DESTINATION],
            body=new_body,
            metadata={LB_NAMESPACE: {DESTINATION: destination}},
        )
        return decision, Routed(request_id, req.model, res.target_model, endpoint, tokens,
                                len(body))

    def finish(self, routed: Routed, *, completed: bool, status: int, response_size: int,
               prompt_tokens: int, completion_tokens: int) -> None:
        """The response ended (or the stream broke): release the endpoint and record it."""
        routed.endpoint.end_request(routed.tokens)
        labels = (routed.client_model, routed.target_model)
        m.RUNNING.labels(routed.client_model).dec()
        if not completed or status >= 400:
            m.ERRORS.labels(*labels, str(status) if completed else "stream_broken").inc()
            return
        elapsed = time.monotonic() - routed.started
        m.DURATION.labels(*labels).observe(elapsed)
        m.RESPONSE_SIZES.labels(*labels).observe(response_size)
        if prompt_tokens:
            m.INPUT_TOKENS.labels(*labels).observe(prompt_tokens)
        if completion_tokens:
            m.OUTPUT_TOKENS.labels(*labels).observe(completion_tokens)
            m.NTPOT.labels(*labels).observe(elapsed / completion_tokens)

    @staticmethod
    def count_error(headers: Mapping[str, str], err: GatewayError) -> None:
        """A request the director refused (labelled by whatever model it named)."""
        m.ERRORS.labels(headers.get("x-gateway-model-name", ""), "", err.code).inc()

    # -- steps -------------------------------------------------------------------------

    def _candidates(self, filter_metadata: Mapping[str, Any]) -> Sequence[EndpointView]:
        """The pool's healthy endpoints, narrowed by the proxy's subset hint (ip:port)."""
        candidates = self.datastore.candidates()
        hint = filter_metadata.get(SUBSET_NAMESPACE) if self.subset_filter else None
        if hint is not None and DESTINATION + "-subset" in hint:
            allowed = {str(a) for a in hint[DESTINATION + "-subset"] or ()}
            candidates = tuple(v for v in candidates if v.key in allowed)
            if not candidates:
                raise NoCandidates("no endpoint of the subset hint is ready in the pool")
        if not candidates:
            raise NoCandidates("no ready endpoint in the pool")
        # Metrics older than the staleness threshold (a hung /metrics) can't be trusted:
        # prefer endpoints with fresh ones, but never refuse a request only for staleness.
        oldest = time.monotonic() - self.staleness
        fresh = tuple(v for v in candidates if v.metrics.updated_at >= oldest)
        return fresh or candidates

    def _served(self) -> tuple[frozenset[str], frozenset[str]]:
        """(base models, adapters) the pool's servers report, recomputed at most every
        :data:`SERVED_TTL` seconds rather than per request."""
        now = time.monotonic()
        if now >= self._served_until:
            base: set[str] = set()
            adapters: set[str] = set()
            for v in self.datastore.candidates():
                base |= v.metrics.models
                if v.metrics.lora is not None:
                    adapters |= v.metrics.lora.running | v.metrics.lora.waiting
            self._served_cache = (frozenset(base), frozenset(adapters))
            self._served_until = now + SERVED_TTL
        return self._served_cache

    def _serves_base(self, model: str) -> bool:
        return model in self._served()[0]

    def _known(self, snap: Snapshot, model: str, rewritten: bool) -> bool:
        if rewritten or model in snap.legacy_models:
            return True
        base, adapters = self._served()
        return model in base or model in adapters
