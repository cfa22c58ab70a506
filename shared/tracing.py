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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

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
    global TRACER, _provider
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
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

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
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT)
        insecure = None
        if endpoint.startswith("http://"):
            insecure = True  # as upstream's Go exporter reads the scheme
        span_exporter = OTLPSpanExporter(endpoint=endpoint, insecure=insecure)
    else:
        span_exporter = ConsoleSpanExporter(
            formatter=lambda span: span.to_json(indent=None) + os.linesep)
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    _provider = provider
    TRACER = provider.get_tracer("inference-gateway-py", service_version)
    return exporter


def shutdown() -> None:
    """Flush what is queued and stop exporting (at the end of the process)."""
    global TRACER, _provider
    if _provider is not None:
        _provider.shutdown()
    TRACER, _provider = None, None


class RequestTrace:
    """One sampled request's root span, and a way to hang child spans under it.

    Only built for a request the sampler kept, so whatever holds one records.
    """

    __slots__ = ("_ctx", "root", "tracer")

    def __init__(self, tracer: Tracer, root: Span) -> None:
        from opentelemetry.trace import set_span_in_context

        self.tracer = tracer
        self.root = root
        self._ctx = set_span_in_context(root)

    def span(self, name: str, attributes: Mapping[str, Any] | None = None,
             parent: Span | None = None) -> Span:
        """Start a child of ``parent`` (default: the root); the caller ends it."""
        if parent is None:
            ctx = self._ctx
        else:
            from opentelemetry.trace import set_span_in_context

            ctx = set_span_in_context(parent)
        return self.tracer.start_span(name, context=ctx, attributes=attributes)

    def fail(self, span: Span, error: BaseException) -> None:
        """Record on ``span`` the answer ``error`` ended the request with: failed for a
        4xx/5xx (or any other exception), not for a direct 2xx answer (BBR's model list)."""
        from opentelemetry.trace import Status, StatusCode

        status = getattr(error, "status", None)
        if isinstance(status, int):
            span.set_attribute("http.response.status_code", status)
            if status < 400:
                return
        span.set_status(Status(StatusCode.ERROR, str(error)))
        code = getattr(error, "code", None)
        if isinstance(code, str):
            span.set_attribute("error.type", code)


def start_request(name: str, headers: Mapping[str, str],
                  grpc_traceparent: str | None = None) -> RequestTrace | None:
    """The request's server span, continuing the caller's trace; None when tracing is off
    or the sampler dropped the request.

    The parent is, in order: the ``traceparent`` Envoy put on the ext_proc gRPC call (its
    span for that call, when Envoy traces), else the one in the HTTP request's headers (the
    client's, which is what Envoy passes on when it does not trace)."""
    tracer = TRACER
    if tracer is None:
        return None
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: Mapping[str, str] = headers
    if grpc_traceparent:
        carrier = {TRACEPARENT: grpc_traceparent}
    ctx = TraceContextTextMapPropagator().extract(carrier) if TRACEPARENT in carrier else None
    root = tracer.start_span(name, context=ctx, kind=SpanKind.SERVER)
    if not root.is_recording():
        return None
    return RequestTrace(tracer, root)


def active() -> bool:
    """Tracing is on in this process."""
    return TRACER is not None


__all__ = ["DEFAULT_ENDPOINT", "DEFAULT_RATIO", "DEFAULT_SAMPLER", "TRACER", "RequestTrace",
           "TracingConfigError", "active", "configure", "exporter_name", "sampler_from_env",
           "shutdown", "start_request"]
