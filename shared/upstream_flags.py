"""Upstream (GIE v1.5.0) flags both services take so that upstream Deployments run unchanged.

(``--tracing`` is declared here and implemented by :mod:`shared.tracing`: see
:func:`start_tracing`.)

Each flag here is one of three kinds, and docs/compatibility.md lists which:

- **implemented**: the ``--zap-*`` logging flags (controller-runtime's names and values);
- **deprecated upstream**: accepted, applied, and a warning says what replaces it (the EPP
  adds its own, e.g. ``--model-server-metrics-scheme``);
- **no meaning here**: accepted, validated, and, when given, a log line says why it changes
  nothing (``--enable-pprof`` is Go's profiler, for example).

A bad value still stops the service with one line naming the flag (argparse's error).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from shared.flags import Parser

#: controller-runtime's ``--zap-log-level`` names (a positive integer means that debug depth).
ZAP_LEVELS: Mapping[str, int] = {
    "debug": logging.DEBUG, "info": logging.INFO, "error": logging.ERROR,
    "panic": logging.CRITICAL,
}
ZAP_STACKTRACE_LEVELS = ("info", "error", "panic")
ZAP_ENCODERS = ("json", "console")
ZAP_TIME_ENCODINGS = ("epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano")


def zap_level(text: str) -> str:
    """Validate ``--zap-log-level``: a level name or an integer > 0."""
    import argparse

    t = text.strip().lower()
    if t in ZAP_LEVELS or (t.isdigit() and int(t) > 0):
        return t
    raise argparse.ArgumentTypeError(
        f"invalid level {text!r} (use debug, info, error, panic or an integer > 0)")


def add_logging_flags(p: Parser) -> None:
    """controller-runtime's zap flags, which upstream's images take (``--zap-encoder json``)."""
    p.add_bool("--zap-devel", default=False,
               help="development logging: console lines and debug level (unless "
                    "--zap-encoder / --zap-log-level say otherwise)")
    p.add_argument("--zap-encoder", choices=ZAP_ENCODERS, default=None,
                   help="log line format (default: json, console on a terminal)")
    p.add_argument("--zap-log-level", type=zap_level, default=None, metavar="LEVEL",
                   help="debug, info, error, panic, or an integer > 0 (a -v depth); "
                        "default from -v")
    p.add_argument("--zap-stacktrace-level", choices=ZAP_STACKTRACE_LEVELS, default=None,
                   help="accepted for upstream compatibility: exceptions are always logged "
                        "with their traceback")
    p.add_argument("--zap-time-encoding", choices=ZAP_TIME_ENCODINGS, default=None,
                   help="timestamp format (default iso8601)")


def add_diagnostics_flags(p: Parser) -> None:
    """Upstream's diagnostics flags that are Go- or Kubernetes-specific."""
    p.add_bool("--tracing", default=True,
               help="emit OpenTelemetry traces (OTEL_TRACES_EXPORTER otlp|console|none, "
                    "OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER[_ARG]); with no "
                    "exporter named, console when this flag is given, else off")
    p.add_bool("--enable-pprof", default=True,
               help="upstream: Go pprof handlers; accepted and ignored (no Go runtime)")
    p.add_bool("--metrics-endpoint-auth", default=True,
               help="upstream: Kubernetes TokenReview on the metrics port; accepted and "
                    "ignored, use --metrics-bearer-token-file")


@dataclass(frozen=True, slots=True)
class LogSettings:
    """What the logging flags ask for (see :func:`shared.logs.configure`)."""

    level: int
    json: bool | None
    time_format: str | None


def log_settings(args: Any) -> LogSettings:
    """The log level, format and timestamp the ``-v`` and ``--zap-*`` flags give."""
    from shared.logs import level_for

    level = level_for(args.verbosity)
    json: bool | None = None
    if args.zap_devel:
        level, json = logging.DEBUG, False
    if args.zap_encoder is not None:
        json = args.zap_encoder == "json"
    if args.zap_log_level is not None:
        raw = args.zap_log_level
        level = ZAP_LEVELS[raw] if raw in ZAP_LEVELS else level_for(int(raw))
    return LogSettings(level=level, json=json, time_format=args.zap_time_encoding)


#: Flags that change nothing here, and why (logged once at start when given).
IGNORED: Mapping[str, str] = {
    "enable_pprof": "--enable-pprof: Go's pprof profiler has no Python counterpart; "
                    "use py-spy against the process instead",
    "metrics_endpoint_auth": "--metrics-endpoint-auth: Kubernetes TokenReview is not "
                             "done here; protect the metrics port with "
                             "--metrics-bearer-token-file",
    "zap_stacktrace_level": "--zap-stacktrace-level: every logged exception carries its "
                            "traceback",
}


#: Upstream's default ``OTEL_SERVICE_NAME`` per command (llm-d-router v0.10's EPP, GIE
#: v1.5's BBR).
SERVICE_NAMES: Mapping[str, str] = {"epp": "llm-d-epp",
                                    "bbr": "gateway-api-inference-extension/bbr"}


def start_tracing(args: Any, prog: str, log: structlog.typing.FilteringBoundLogger) -> None:
    """Set up OpenTelemetry as ``--tracing`` and the ``OTEL_*`` variables ask (one line and
    exit for a bad variable); logs the exporter when tracing is on."""
    import os

    from shared import tracing
    from shared.flags import die

    given = "tracing" in getattr(args, "given_flags", set())
    try:
        exporter = tracing.configure(args.tracing, SERVICE_NAMES.get(prog, prog),
                                     flag_given=given)
    except tracing.TracingConfigError as e:
        die(prog, str(e))
    if exporter != "none":
        log.info("tracing on", exporter=exporter,
                 sampler=os.environ.get("OTEL_TRACES_SAMPLER", tracing.DEFAULT_SAMPLER),
                 sampler_arg=os.environ.get("OTEL_TRACES_SAMPLER_ARG",
                                            str(tracing.DEFAULT_RATIO)),
                 endpoint=(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                           or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                           or tracing.DEFAULT_ENDPOINT) if exporter == "otlp" else None)


def report(args: Any, log: structlog.typing.FilteringBoundLogger,
           ignored: Mapping[str, str] = IGNORED,
           deprecated: Mapping[str, str] | None = None) -> None:
    """Log, for each flag given on the command line, why it is ignored or what replaces it.

    Only flags written on the command line are reported (``args.given_flags``), so a default
    never warns; ``--enable-pprof=false`` asks for what already happens and stays quiet too.
    """
    given: set[str] = getattr(args, "given_flags", set())
    for dest, why in ignored.items():
        if dest in given and getattr(args, dest) not in (False, None):
            log.warning("flag accepted but ignored", reason=why)
    for dest, why in (deprecated or {}).items():
        if dest in given:
            log.warning("flag is deprecated", reason=why)


__all__ = ["IGNORED", "LogSettings", "add_diagnostics_flags", "add_logging_flags",
           "log_settings", "report", "start_tracing", "zap_level"]
