"""The BBR exchange: parse the body once, let each plugin name its headers, and ask Envoy to
re-match the route with them."""

from __future__ import annotations

import time
from collections.abc import Sequence

from bbr import metrics
from bbr.models import ModelListing
from bbr.plugins import HeaderPlugin
from shared import tracing
from shared.errors import GatewayError, for_path
from shared.extproc import Exchange, RequestDecision
from shared.openai import model_field, parse_json_object


class BodyRouter:
    """Holds the configured plugins; makes one :class:`RouterExchange` per stream."""

    def __init__(self, plugins: Sequence[HeaderPlugin],
                 models: ModelListing | None = None, *, require_model: bool = True) -> None:
        self.plugins = list(plugins)
        #: A JSON body without a usable ``model`` ends at the gateway with the EPP's 400
        #: (``missing_model`` / ``invalid_model``); False: it passes on without the header,
        #: to whatever route matches without it (upstream BBR).
        self.require_model = require_model
        #: Answers ``GET /v1/models`` at the gateway (see :mod:`bbr.models`); None: passed on.
        self.models = models
        self.owned = sorted({h for p in self.plugins for h in p.owned_headers})
        self._timers = [
            metrics.PLUGIN_DURATION.labels(plugin_type=p.type_name, plugin_name=p.name)
            for p in self.plugins
        ]

    def decide(self, body: bytes, trace: tracing.RequestTrace | None = None) -> RequestDecision:
        """Headers for a request body; a headers-only request passes unchanged. With a
        ``trace`` (a sampled request) parsing and each plugin get a span.

        :class:`~shared.errors.BadRequest` for a body that is not a JSON object, and (with
        ``require_model``) for one whose ``model`` is missing, empty or not a string."""
        if not body:
            return RequestDecision()
        span = trace.span("parse", {"http.request.body.size": len(body)}) if trace else None
        try:
            data = parse_json_object(body)
        except GatewayError as e:
            metrics.ERRORS.labels(code=str(e.status)).inc()
            if trace is not None and span is not None:
                trace.fail(span, e)
            raise
        finally:
            if span is not None:
                span.end()
        set_headers: dict[str, str] = {}
        for plugin, timer in zip(self.plugins, self._timers, strict=True):
            pspan = trace.span(f"bbr.plugin.{plugin.type_name}", {
                "bbr.plugin.type": plugin.type_name,
                "bbr.plugin.name": plugin.name}) if trace is not None else None
            start = time.perf_counter()
            found = plugin.headers(data)
            set_headers.update(found)
            timer.observe(time.perf_counter() - start)
            if pspan is not None:
                pspan.set_attribute("bbr.plugin.headers", [f"{k}: {v}" for k, v in found.items()])
                pspan.end()
        if trace is not None:
            model = data.get("model")
            if isinstance(model, str):
                trace.root.set_attribute("gen_ai.request.model", model)
        if self.require_model:
            try:
                model_field(data)
            except GatewayError as e:
                metrics.ERRORS.labels(code=str(e.status)).inc()
                raise
        metrics.SUCCESS.inc()
        # A client's own copy of a header we own must not pick the route for it.
        remove = [h for h in self.owned if h not in set_headers]
        return RequestDecision(
            set_headers=set_headers, remove_headers=remove, clear_route_cache=True
        )

    def exchange(self) -> RouterExchange:
        return RouterExchange(self)


class RouterExchange(Exchange):
    """One request through the router."""

    __slots__ = ("router",)
    wants_response = False

    def __init__(self, router: BodyRouter) -> None:
        self.router = router

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestDecision:
        trace = None
        if tracing.TRACER is not None:
            trace = tracing.start_request("gateway.request", headers, self.grpc_traceparent)
        if trace is None:
            return self._decide(headers, body, None)
        try:
            return self._decide(headers, body, trace)
        except GatewayError as e:
            trace.fail(trace.root, e)
            raise
        finally:
            trace.root.end()

    def _decide(self, headers: dict[str, str], body: bytes,
                trace: tracing.RequestTrace | None) -> RequestDecision:
        models = self.router.models
        if models is not None and not body:
            models.answer(headers.get(":method", ""), headers.get(":path", ""))
        try:
            return self.router.decide(body, trace)
        except GatewayError as e:
            for_path(e, headers.get(":path", ""))
            raise
