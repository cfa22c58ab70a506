"""OpenTelemetry tracing for both services, configured as upstream (llm-d-router v0.10).

``--tracing`` turns it on; the standard variables say the rest:

- ``OTEL_TRACES_EXPORTER``: ``otlp`` (OTLP/gRPC to ``OTEL_EXPORTER_OTLP_ENDPOINT``, default
  ``http://localhost:4317``, with the exporter's other ``OTEL_EXPORTER_OTLP_*`` variables),
  ``console`` (one JSON line per span on stdout) or ``none``. Unset: ``console`` when
  ``--tracing`` was written on the command line (upstream's default exporter), else no
  tracing at all - upstream's flag defaults to true, and a quiet default keeps the JSON log
  stream and the hot path as they were (docs/tracing.md).
- ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``: default
  ``parentbased_traceidratio`` at ``0.1``, as upstream. A client's (or Envoy's) sampled
  ``traceparent`` is always followed.
- ``OTEL_SERVICE_NAME`` (default the service's own name), ``OTEL_RESOURCE_ATTRIBUTES``.

Hot path: with tracing off :data:`TRACER` is None and :func:`start_request` returns None at
once; for a request the sampler drops, it returns None too, so no child span or attribute is
ever built for it. Call sites test ``trace is not None`` and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from time import time_ns
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

_log = structlog.get_logger("tracing")

#: Upstream's defaults (pkg/common/observability/tracing).
DEFAULT_ENDPOINT = "http://localhost:4317"
DEFAULT_SAMPLER = "parentbased_traceidratio"
DEFAULT_RATIO = 0.1
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
EXPORTERS = ("otlp", "console", "none")

#: The process's tracer; None while tracing is off (the only test on the hot path).
TRACER: Tracer | None = None
_provider: TracerProvider | None = None
#: What a request's spans need, looked up once in :func:`configure` (not per request).
_api: _Api | None = None


class _Api:
    """The OpenTelemetry names the per-request path uses, bound once, and where finished
    spans go (the provider's own batch processor)."""

    def __init__(self, processor: Any, resource: Any, scope: Any, sampler: Any,
                 ids: Any) -> None:
        import random

        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import (
            SpanContext,
            SpanKind,
            Status,
            StatusCode,
            TraceFlags,
            get_current_span,
        )
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.server = SpanKind.SERVER
        self.internal = SpanKind.INTERNAL
        self.current_span = get_current_span
        self.propagator = TraceContextTextMapPropagator()
        self.status, self.error, self.unset = Status, StatusCode.ERROR, Status(StatusCode.UNSET)
        self.span_context, self.sampled = SpanContext, TraceFlags(TraceFlags.SAMPLED)
        self.readable = ReadableSpan
        self.processor, self.resource, self.scope = processor, resource, scope
        self.should_sample, self.new_trace_id = sampler.should_sample, ids.generate_trace_id
        self.root_bound = _ratio_bound(sampler)
        self.random_bits = random.getrandbits
        self.span_id = random.SystemRandom().getrandbits(64) | 1  # a counter from a random
        # start: unique within the process, no RNG call per span


def _ratio_bound(sampler: Any) -> int | None:
    """The trace-id bound a ``traceidratio`` sampler (or ``parentbased_traceidratio``, for a
    request with no parent) keeps a trace under; None for any other sampler."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    root = getattr(sampler, "_root", None) if isinstance(sampler, ParentBased) else sampler
    return root.bound if isinstance(root, TraceIdRatioBased) else None


class TracingConfigError(ValueError):
    """A tracing variable has a value that cannot be used."""


def sampler_from_env(env: Mapping[str, str]) -> Any:
    """The sampler ``OTEL_TRACES_SAMPLER``/``_ARG`` name (upstream's default when unset).

    A bad name or ratio is an error here (upstream falls back silently; a typo deserves a
    line)."""
    from opentelemetry.sdk.trace import sampling as s

    name = env.get("OTEL_TRACES_SAMPLER", DEFAULT_SAMPLER).strip().lower()
    raw = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    ratio = DEFAULT_RATIO
    if raw:
        try:
            ratio = float(raw)
        except ValueError:
            raise TracingConfigError(
                f"OTEL_TRACES_SAMPLER_ARG={raw!r} is not a number") from None
        if not 0.0 <= ratio <= 1.0:
            raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={raw!r} is not in [0, 1]")
    samplers = {
        "always_on": lambda: s.ALWAYS_ON,
        "always_off": lambda: s.ALWAYS_OFF,
        "traceidratio": lambda: s.TraceIdRatioBased(ratio),
        "parentbased_always_on": lambda: s.ParentBased(s.ALWAYS_ON),
        "parentbased_always_off": lambda: s.ParentBased(s.ALWAYS_OFF),
        "parentbased_traceidratio": lambda: s.ParentBased(s.TraceIdRatioBased(ratio)),
    }
    if name not in samplers:
        raise TracingConfigError(
            f"OTEL_TRACES_SAMPLER={name!r} is not one of {', '.join(samplers)}")
    return samplers[name]()


def exporter_name(env: Mapping[str, str], flag_given: bool) -> str:
    """``otlp``, ``console`` or ``none`` (see the module docstring for the default)."""
    name = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not name:
        return "console" if flag_given else "none"
    if name not in EXPORTERS:
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER={name!r} is not one of {', '.join(EXPORTERS)}")
    return name


def configure(enabled: bool, service_name: str, *, flag_given: bool = False,
              env: Mapping[str, str] | None = None) -> str:
    """Set up tracing for this process; returns the exporter in use (``none``: off).

    Raises :class:`TracingConfigError` for a bad variable."""
    global TRACER, _provider, _api
    env = os.environ if env is None else env
    if not enabled:
        return "none"
    exporter = exporter_name(env, flag_given)
    if exporter == "none":
        return "none"
    sampler = sampler_from_env(env)
    # Imported here: a process without tracing never loads the SDK.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    try:
        from importlib.metadata import version

        service_version = version("inference-gateway-py")
    except Exception:
        service_version = "dev"
    attrs = {"service.name": env.get("OTEL_SERVICE_NAME") or service_name,
             "service.version": service_version}
    provider = TracerProvider(sampler=sampler, resource=Resource.create(attrs))
    span_exporter: Any
    if exporter == "otlp":
        from shared.otlpwire import fast_exporter_class

        endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT)
        insecure = None
        if endpoint.startswith("http://"):
            insecure = True  # as upstream's Go exporter reads the scheme
        span_exporter = fast_exporter_class()(endpoint=endpoint, insecure=insecure)
    else:
        def line(span: Any) -> str:  # our spans (ChildSpan) reach the exporter
            return str(span.readable().to_json(indent=None)) + os.linesep

        span_exporter = ConsoleSpanExporter(formatter=line)
    processor = _Batcher(span_exporter, env)
    # A SpanProcessor by its methods (the SDK's base class would import the SDK at start-up).
    provider.add_span_processor(processor)  # type: ignore[arg-type]
    _provider = provider
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    _api = _Api(processor, provider.resource,
                InstrumentationScope("inference-gateway-py", service_version),
                sampler, provider.id_generator)
    TRACER = provider.get_tracer("inference-gateway-py", service_version)
    return exporter


def shutdown() -> None:
    """Flush what is queued and stop exporting (at the end of the process)."""
    global TRACER, _provider, _api
    if _provider is not None:
        _provider.shutdown()
    TRACER, _provider, _api = None, None, None


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise TracingConfigError(f"{name}={raw!r} is not a whole number") from None
    if value <= 0:
        raise TracingConfigError(f"{name}={raw!r} must be positive")
    return value


class _Batcher:
    """Where finished spans wait for export, and the thread that exports them: in batches of
    ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (512) once that many wait, else every
    ``OTEL_BSP_SCHEDULE_DELAY`` ms (5,000); at most ``OTEL_BSP_MAX_QUEUE_SIZE`` (2,048) wait,
    newer ones are dropped and counted (one warning per batch, not per span). The SDK's
    defaults and variables, but ``OTEL_BSP_EXPORT_TIMEOUT``, which the SDK reads and never
    uses either: an export is bounded by the exporter's ``OTEL_EXPORTER_OTLP_TIMEOUT``.

    The request path only appends to a deque (atomic under the GIL): the SDK's
    ``BatchSpanProcessor`` spent ~10 µs a span there on a pid check, its lock and its
    metrics, a tenth of what a sampled request's spans cost (bench/RESULTS.md)."""

    def __init__(self, exporter: Any, env: Mapping[str, str]) -> None:
        import collections
        import threading

        self.exporter = exporter
        self.delay = _env_int(env, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.batch = _env_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)
        self.limit = _env_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self.dropped = 0
        self._queue: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="span-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Spans are handed over when they end."""

    def on_end(self, span: Any) -> None:
        queue = self._queue
        if len(queue) >= self.limit:
            self.dropped += 1
            return
        queue.append(span)
        if len(queue) >= self.batch and not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self.delay)
            self._wake.clear()
            self._export()

    def _export(self) -> None:
        queue = self._queue
        with self._export_lock:
            while queue:
                batch = [queue.popleft() for _ in range(min(self.batch, len(queue)))]
                try:
                    self.exporter.export(batch)
                except Exception:  # the exporter logs its own failures; export goes on
                    _log.exception("span export failed", spans=len(batch))
            if self.dropped:
                _log.warning("span queue full: spans dropped", dropped=self.dropped,
                             queue_size=self.limit)
                self.dropped = 0

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._export()
        return True

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(10)
        self._export()
        self.exporter.shutdown()


class _Context:
    """A span's identity (``trace_id``, ``span_id``, as the SDK's ``SpanContext`` names them)
    without the SDK's validation on every span: ours are made from valid ids."""

    __slots__ = ("span_id", "trace_id", "trace_state")
    is_valid = True
    is_remote = False

    def __init__(self, trace_id: int, span_id: int, trace_state: Any) -> None:
        self.trace_id, self.span_id, self.trace_state = trace_id, span_id, trace_state

    def sdk(self, api: _Api) -> Any:
        """The SDK's ``SpanContext`` of this span."""
        return api.span_context(self.trace_id, self.span_id, False, api.sampled,
                                self.trace_state)


class ChildSpan:
    """A span of a sampled request (the root, parse, a scorer, ...): its fields, and on
    :meth:`end` itself handed to the batch processor, which the OTLP encoder
    (:mod:`shared.otlpwire`) reads as it would an SDK ``ReadableSpan``.

    The SDK's own ``Span`` costs ~50 µs to start and end here (locks, attribute validation,
    context objects) and a ``ReadableSpan`` built at the end ~10 µs more; ten of them per
    sampled request alone would spend upstream's 10% sampling rate's whole 5% budget.
    Attributes are set by our code with well-typed values, so nothing is lost by skipping
    the checks. :meth:`readable` builds the SDK object for exporters that need one."""

    __slots__ = ("_api", "attributes", "context", "end_time", "kind", "name", "parent",
                 "start_time", "status")

    def __init__(self, api: _Api, name: str, trace_id: int, parent: Any,
                 attributes: Mapping[str, Any] | None, kind: Any = None,
                 trace_state: Any = None) -> None:
        self._api = api
        self.name = name
        self.parent = parent
        api.span_id = span_id = (api.span_id + 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF or 1
        self.context = _Context(trace_id, span_id, trace_state)
        self.attributes: dict[str, Any] = dict(attributes) if attributes else {}
        self.status: Any = api.unset
        self.kind = kind or api.internal
        self.start_time = time_ns()
        self.end_time: int | None = None

    @property
    def resource(self) -> Any:
        return self._api.resource

    @property
    def instrumentation_scope(self) -> Any:
        return self._api.scope

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_status(self, status: Any) -> None:
        self.status = status

    def end(self) -> None:
        self.end_time = time_ns()
        self._api.processor.on_end(self)

    def readable(self) -> Any:
        """The SDK's ``ReadableSpan`` of this span (console export, the SDK's encoder)."""
        api = self._api
        parent = self.parent.sdk(api) if isinstance(self.parent, _Context) else self.parent
        return api.readable(
            self.name, context=self.context.sdk(api), parent=parent, resource=api.resource,
            attributes=self.attributes, kind=self.kind, status=self.status,
            start_time=self.start_time, end_time=self.end_time,
            instrumentation_scope=api.scope)


class RequestTrace:
    """One sampled request's root span, and child spans under it.

    Only built for a request the sampler kept, so whatever holds one records.
    """

    __slots__ = ("_api", "_root_ctx", "_trace_id", "root")

    def __init__(self, root: ChildSpan, api: _Api) -> None:
        self.root = root
        self._api = api
        self._root_ctx = root.context
        self._trace_id = root.context.trace_id

    def span(self, name: str, attributes: Mapping[str, Any] | None = None,
             parent: ChildSpan | None = None) -> ChildSpan:
        """Start a child of ``parent`` (default: the root); the caller ends it."""
        return ChildSpan(self._api, name, self._trace_id,
                         self._root_ctx if parent is None else parent.context, attributes)

    def fail(self, span: ChildSpan, error: BaseException) -> None:
        """Record on ``span`` the answer ``error`` ended the request with: failed for a
        4xx/5xx (or any other exception), not for a direct 2xx answer (BBR's model list)."""
        status = getattr(error, "status", None)
        if isinstance(status, int):
            span.set_attribute("http.response.status_code", status)
            if status < 400:
                return
        span.set_status(self._api.status(self._api.error, str(error)))
        code = getattr(error, "code", None)
        if isinstance(code, str):
            span.set_attribute("error.type", code)


def start_request(name: str, headers: Mapping[str, str],
                  grpc_traceparent: str | None = None) -> RequestTrace | None:
    """The request's server span, continuing the caller's trace; None when tracing is off
    or the sampler dropped the request.

    The parent is, in order: the ``traceparent`` Envoy put on the ext_proc gRPC call (its
    span for that call, when Envoy traces), else the one in the HTTP request's headers (the
    client's, which is what Envoy passes on when it does not trace).

    The configured sampler decides before anything is built: a request it drops costs the
    decision and a trace id (no span object, no context), ~1 µs here; a new trace under a
    ratio sampler, one random draw (the same decision the SDK's sampler takes on that id)."""
    api = _api
    if api is None:
        return None
    carrier: Mapping[str, str] = headers
    if grpc_traceparent:
        carrier = {TRACEPARENT: grpc_traceparent}
    elif TRACEPARENT not in headers and api.root_bound is not None:
        # A new trace under a ratio sampler (upstream's default): its decision on the trace
        # id's low 64 bits, drawn first - a dropped request costs one random draw.
        low = api.random_bits(64)
        if low >= api.root_bound:
            return None
        trace_id = (api.random_bits(63) + 1) << 64 | low  # never the invalid id 0
        root = ChildSpan(api, name, trace_id, None, None, api.server)
        return RequestTrace(root, api)
    ctx = parent = None
    if TRACEPARENT in carrier:
        ctx = api.propagator.extract(carrier)
        parent = api.current_span(ctx).get_span_context()
        if not parent.is_valid:
            parent = None
    trace_id = parent.trace_id if parent is not None else api.new_trace_id()
    decision = api.should_sample(ctx, trace_id, name, api.server)
    if not decision.decision.is_sampled():
        return None
    root = ChildSpan(api, name, trace_id, parent, decision.attributes, api.server,
                     decision.trace_state)
    return RequestTrace(root, api)


def active() -> bool:
    """Tracing is on in this process."""
    return TRACER is not None


__all__ = ["DEFAULT_ENDPOINT", "DEFAULT_RATIO", "DEFAULT_SAMPLER", "TRACER", "ChildSpan",
           "RequestTrace",
           "TracingConfigError", "active", "configure", "exporter_name", "sampler_from_env",
           "shutdown", "start_request"]
