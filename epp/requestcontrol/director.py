"""The director: one request's life, top to bottom.

:meth:`Director.prepare`: parse → resolve (rewrite, objective) → candidates (subset hint) →
saturation shed → the scheduler's request → data producers. :meth:`Director.admit`: the
admitters (may await). :meth:`Director.dispatch`: schedule → pre-request plugins (in-flight
accounting, prefix learning, metrics are plugins there) → headers, metadata and the rewritten
body for Envoy. On the way back: :meth:`response_received`, :meth:`response_chunk` and
:meth:`finish` run the response plugins. Everything pluggable comes from one
:class:`epp.config.Runtime`.
"""

from __future__ import annotations

import inspect
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import structlog

from epp import telemetry as m
from epp.datalayer.models_source import ServedModels
from epp.datastore import EndpointView, Snapshot
from epp.datastore.snapshot import ModelResolution as Resolution
from epp.requestcontrol.plugin import Response
from epp.scheduling import LLMRequest, estimate_tokens, prefix_input
from epp.scheduling.request import max_output_tokens
from epp.scheduling.result import SchedulingResult
from epp.scheduling.scheduler import NoCandidates
from modelserver.multimodal import ENCODER_HEADER, mm_items, mm_prompt_tokens
from modelserver.pd import KV_SOURCE_HEADER, PREFILLER_HEADER
from shared.errors import BadRequest, GatewayError, NotFound, TooManyRequests
from shared.extproc import RequestDecision
from shared.openai import OpenAIRequest

if TYPE_CHECKING:
    from epp.config import Runtime
    from shared.tracing import RequestTrace

log = structlog.get_logger(__name__)

DESTINATION = "x-gateway-destination-endpoint"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
LB_NAMESPACE = "envoy.lb"
#: Key of the per-endpoint scores under ``envoy.lb`` (``--emit-endpoint-scores``).
DESTINATION_SCORES = "x-gateway-destination-endpoint-scores"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
REWRITE_HEADER = "x-gateway-model-name-rewrite"
REQUEST_ID = "x-request-id"
#: How long the set of served models (from scraped metrics) is reused.
SERVED_TTL = 0.5


class Shed(TooManyRequests):
    """429: a sheddable request while the pool is saturated."""

    code = "shed"


@dataclass(slots=True)
class Pending:
    """A request between :meth:`Director.prepare` and :meth:`Director.dispatch`."""

    request: LLMRequest
    candidates: Sequence[EndpointView]
    headers: Mapping[str, str]
    #: The body to send instead of the client's (the model was rewritten), or None.
    new_body: bytes | None
    filter_metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Routed:
    """A request the director sent somewhere; what the response side needs to close it."""

    request: LLMRequest
    endpoint: EndpointView
    response: Response
    started: float = field(default_factory=time.monotonic)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def client_model(self) -> str:
        return self.request.client_model

    @property
    def target_model(self) -> str:
        return self.request.target_model


class Director:
    """Routes requests for one pool, calling the runtime's plugins in upstream's order."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.datastore = runtime.datastore
        self.scheduler = runtime.scheduler
        self.saturation = runtime.saturation
        self.rng = runtime.rng
        s = runtime.settings
        self.reject_unknown_models = s.reject_unknown_models
        self.subset_filter = s.subset_filter
        self.emit_scores = s.emit_endpoint_scores
        self.staleness = s.staleness
        self._debug = logging.getLogger().isEnabledFor(logging.DEBUG)
        self._served_cache: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        self._served_until = 0.0

    @classmethod
    def of(cls, runtime: Runtime) -> Director:
        """The director of ``runtime`` (see :func:`epp.config.build`)."""
        return cls(runtime)

    # -- the request -----------------------------------------------------------------

    def route(
        self, headers: Mapping[str, str], body: bytes, filter_metadata: Mapping[str, Any]
    ) -> tuple[RequestDecision, Routed]:
        """prepare → admit → dispatch, for runtimes whose admitters never wait (the
        ext_proc exchange uses the three steps itself so that an admitter may await)."""
        pending = self.prepare(headers, body, filter_metadata)
        for admitter in self.runtime.admitters:
            if inspect.isawaitable(waiting := admitter.admit(pending.request,
                                                             pending.candidates)):
                waiting.close()  # type: ignore[attr-defined]
                raise RuntimeError(f"admitter {admitter!r} awaits: use Director.admit")
        return self.dispatch(pending)

    def prepare(
        self, headers: Mapping[str, str], body: bytes, filter_metadata: Mapping[str, Any],
        trace: RequestTrace | None = None,
    ) -> Pending:
        """Everything before admission; raises :class:`GatewayError` when it can't go on.
        ``trace``: the request is sampled; it rides on the scheduler's request from here."""
        if trace is None:
            req = self.runtime.parser.parse(body, headers.get(":path", "/"))
        else:
            req = self._traced_parse(trace, body, headers)
        res = self._resolve(req, headers)
        if res.rewrite_name is not None:
            m.rewrite_decision(res.rewrite_name, req.model, res.target_model)
        # With flow control an empty pool is a waiting room (scale from zero): flow control
        # holds the request and answers 503 rejected-no-endpoints itself (upstream v0.10).
        candidates = self._candidates(filter_metadata,
                                      allow_empty=self.runtime.flow_control is not None)
        # With flow control, sheddable requests wait in its queues instead (as upstream).
        if (res.priority < 0 and self.runtime.flow_control is None
                and self.saturation.is_saturated(candidates)):
            raise Shed("the pool is saturated; sheddable requests are rejected")
        request, new_body = self._scheduling_request(req, res, headers, len(body))
        if trace is not None:
            request.trace = trace
            trace.root.set_attributes({
                "gen_ai.request.id": request.request_id, "gen_ai.request.model": req.model,
                "llm_d.epp.target_model": res.target_model,
                "llm_d.epp.request.priority": res.priority})
        for producer in self.runtime.producers:
            producer.produce(request, candidates)
        return Pending(request, candidates, headers, new_body, filter_metadata)

    async def admit(self, pending: Pending) -> None:
        """Every admitter accepts (an admitter may await, e.g. a queue); else it raised."""
        waited = False
        trace = pending.request.trace
        for admitter in self.runtime.admitters:
            waiting = admitter.admit(pending.request, pending.candidates)
            if waiting is not None:
                if trace is None:
                    await waiting
                else:
                    await self._traced_wait(trace, admitter, waiting,
                                            pending.request.priority)
                waited = True
        if waited:  # late binding: schedule over the pool as it is now, not at arrival
            pending.candidates = self._candidates(pending.filter_metadata)

    def dispatch(self, pending: Pending) -> tuple[RequestDecision, Routed]:
        """Schedule, run the pre-request plugins (the commit), answer Envoy."""
        request = pending.request
        for screener in self.runtime.screeners:
            pending.candidates = screener.screen(request, pending.candidates)
        try:
            result = self.scheduler.schedule(request, pending.candidates)
        except GatewayError:
            m.scheduler_attempt(request.target_model, None)
            raise
        m.scheduler_attempt(request.target_model, result.endpoints[0])
        trace = request.trace
        if trace is None:
            for plugin in self.runtime.pre_request:
                plugin.pre_request(request, result)
        else:
            span = trace.span("pre_request", {"llm_d.epp.plugins": [
                str(getattr(p, "type_name", type(p).__name__)) for p in self.runtime.pre_request]})
            try:
                for plugin in self.runtime.pre_request:
                    plugin.pre_request(request, result)
            finally:
                span.end()
            trace.root.set_attribute("llm_d.epp.destination", result.destination)
        if self._debug:
            log.debug("picked", request_id=request.request_id, model=request.client_model,
                      target_model=request.target_model, endpoint=result.destination,
                      priority=request.priority, scores=result.primary.scores())
        routed = Routed(request, result.endpoints[0], Response(request.request_id))
        return self._decision(pending, result), routed

    # -- the response ----------------------------------------------------------------

    def response_received(self, routed: Routed, status: int, headers: Mapping[str, str],
                          metadata: Mapping[str, Any] | None = None) -> dict[str, str]:
        """The endpoint's response headers arrived (with the proxy's forwarded metadata);
        returns the headers plugins add to the client's response."""
        r = routed.response
        r.status, r.headers = status, headers
        r.streamed = headers.get("content-type", "").startswith("text/event-stream")
        if metadata:
            r.metadata = metadata
        for plugin in self.runtime.response_received:
            plugin.response_received(routed.request, r, routed.endpoint)
        return r.set_headers

    def response_chunk(self, routed: Routed, chunk: bytes, first_token: bool) -> None:
        """A piece of the response body; ``first_token``: a token has been seen by now."""
        response = routed.response
        if first_token and response.ttft is None:
            self.first_token(routed, time.monotonic() - routed.started)
        for plugin in self.runtime.response_streaming:
            plugin.response_streaming(routed.request, response, chunk, routed.endpoint)

    def first_token(self, routed: Routed, ttft: float) -> None:
        """The response's first token arrived ``ttft`` seconds after the pick."""
        routed.response.ttft = ttft
        for plugin in self.runtime.first_token:
            plugin.first_token(routed.request, routed.response, routed.endpoint)

    def response_metadata(self, routed: Routed,
                          usage: Mapping[str, Any] | None) -> dict[str, dict[str, Any]] | None:
        """The whole response was seen: metadata the response-metadata plugins give the
        proxy, merged by namespace (None when there is none)."""
        out: dict[str, dict[str, Any]] = {}
        for plugin in self.runtime.response_metadata:
            for ns, values in (plugin.response_metadata(
                    routed.request, routed.response, usage or {}) or {}).items():
                out.setdefault(ns, {}).update(values)
        return out or None

    def finish(self, routed: Routed, *, completed: bool, status: int, response_size: int,
               prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> None:
        """The response ended (or the stream broke): the response-complete plugins release
        the endpoint and record the request."""
        r = routed.response
        r.completed, r.status, r.size = completed, status, response_size
        r.prompt_tokens, r.completion_tokens = prompt_tokens, completion_tokens
        r.cached_tokens = cached_tokens
        r.elapsed = time.monotonic() - routed.started
        if completion_tokens > 1 and r.ttft is not None:
            r.tpot = (r.elapsed - r.ttft) / (completion_tokens - 1)
        elif completion_tokens:
            r.tpot = r.elapsed / completion_tokens
        if r.ttft is None and completed and not r.streamed:
            r.ttft = r.elapsed  # not streamed: the first token arrives with the last
        for plugin in self.runtime.response_complete:
            plugin.response_complete(routed.request, r, routed.endpoint)

    @staticmethod
    def count_error(headers: Mapping[str, str], err: GatewayError) -> None:
        """A request the director refused (labelled by whatever model it named)."""
        m.request_error(headers.get("x-gateway-model-name", ""), "", m.fairness_id(headers), "0",
                        err.code)

    # -- steps -------------------------------------------------------------------------

    def _traced_parse(self, trace: RequestTrace, body: bytes,
                      headers: Mapping[str, str]) -> OpenAIRequest:
        """The parser's work as the ``parse`` span of a sampled request."""
        span = trace.span("parse", {"http.request.body.size": len(body),
                                    "url.path": headers.get(":path", "/")})
        try:
            req = self.runtime.parser.parse(body, headers.get(":path", "/"))
            span.set_attribute("gen_ai.request.model", req.model)
            return req
        except GatewayError as e:
            trace.fail(span, e)
            raise
        finally:
            span.end()

    @staticmethod
    async def _traced_wait(trace: RequestTrace, admitter: Any, waiting: Any,
                           priority: int) -> None:
        """An admitter's wait (flow control's queue) as a span of a sampled request."""
        span = trace.span("flow_control_wait", {
            "llm_d.epp.admitter.type": str(getattr(admitter, "type_name", "")),
            "llm_d.epp.request.priority": priority})
        try:
            await waiting
        except GatewayError as e:
            trace.fail(span, e)
            raise
        finally:
            span.end()

    def _resolve(self, req: OpenAIRequest, headers: Mapping[str, str]) -> Resolution:
        """Target model (rewrites) and priority (objective); 404 for unknown models when
        ``--reject-unknown-models``."""
        snap = self.datastore.snapshot
        res = snap.resolve(req.model, rng=self.rng, rewrite_header=headers.get(REWRITE_HEADER),
                           objective_header=headers.get(OBJECTIVE_HEADER))
        if self.reject_unknown_models and not self._known(snap, req.model, res.rewritten):
            raise NotFound(f"model {req.model!r} is not served by this pool")
        return res

    def _scheduling_request(self, req: OpenAIRequest, res: Resolution,
                            headers: Mapping[str, str], size: int,
                            ) -> tuple[LLMRequest, bytes | None]:
        """What the scheduler is asked, and the rewritten body (None when unchanged)."""
        # orjson reads JSON nested up to 1,024 levels but writes only 255: a body between the
        # two would otherwise raise TypeError past the stream (a 500) - or, for the rewrite,
        # after the endpoint was committed (a leaked in-flight count).
        try:
            prompt = prefix_input(req.prompt, req.messages)
            new_body = None
            if req.model_absent:  # a JSON body without model: a match-all rewrite names it
                if not res.target_model:
                    raise BadRequest("the request has no 'model' field and no "
                                     "InferenceModelRewrite rule matches every request",
                                     code="missing_model")
                req.body["model"] = res.target_model
                new_body = req.dumps()
            elif res.target_model != req.model and req.model:  # other parsers: body as is
                req.body["model"] = res.target_model
                new_body = req.dumps()  # JSON, or the parser's own wire format
        except orjson.JSONEncodeError as e:
            raise BadRequest(f"request body cannot be re-encoded: {e}",
                             code="invalid_body") from None
        salt = req.body.get("cache_salt")
        mm = mm_items(req.messages)
        request = LLMRequest(
            request_id=headers.get(REQUEST_ID) or str(uuid.uuid4()),
            target_model=res.target_model,
            client_model=req.model,
            prompt=prompt,
            prompt_tokens=(len(req.token_ids) if req.token_ids is not None
                           else mm_prompt_tokens(req.messages, mm) if mm
                           else estimate_tokens(prompt)),
            mm_items=mm,
            prompt_token_ids=req.token_ids,
            priority=res.priority,
            headers=headers,
            lora_adapter=None if self._serves_base(res.target_model) else res.target_model,
            cache_salt=salt if isinstance(salt, str) else "",
            objective=res.objective,
            request_size=size,
            stream=req.stream,
            max_output_tokens=max_output_tokens(req.limits),
        )
        return request, new_body

    def _decision(self, pending: Pending, result: SchedulingResult) -> RequestDecision:
        destination = result.destination
        headers = pending.headers
        lb: dict[str, Any] = {DESTINATION: destination}
        if self.emit_scores and result.primary.totals:
            # Every endpoint the primary profile scored, not only the picks (as upstream).
            lb[DESTINATION_SCORES] = result.primary.scores()
        return RequestDecision(
            set_headers={DESTINATION: destination, REQUEST_ID: pending.request.request_id,
                         **result.extra_headers},
            # A client's own copies of our control headers never reach the proxy's LB, and a
            # client never names a prefiller or an encoder (only a disagg handler's pick, set
            # above, does).
            remove_headers=[h for h in headers if (h.startswith(DESTINATION) and h != DESTINATION)
                            or (h in (PREFILLER_HEADER, KV_SOURCE_HEADER, ENCODER_HEADER)
                                and h not in result.extra_headers)],
            body=pending.new_body,
            metadata={LB_NAMESPACE: lb},
        )

    def _candidates(self, filter_metadata: Mapping[str, Any], *,
                    allow_empty: bool = False) -> Sequence[EndpointView]:
        """The pool's healthy endpoints, narrowed by the proxy's subset hint (ip:port)."""
        candidates = self.datastore.candidates()
        hint = filter_metadata.get(SUBSET_NAMESPACE) if self.subset_filter else None
        if hint is not None and DESTINATION + "-subset" in hint:
            allowed = {str(a) for a in hint[DESTINATION + "-subset"] or ()}
            candidates = tuple(v for v in candidates if v.key in allowed)
            if not candidates:
                raise NoCandidates("no endpoint of the subset hint is ready in the pool")
        if not candidates:
            if allow_empty:
                return candidates
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
                if (listed := v.attribute(ServedModels)) is not None:  # models-data-source
                    base |= listed.base_models
                    adapters |= listed.adapters
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
