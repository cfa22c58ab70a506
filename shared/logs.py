"""structlog setup: JSON lines in production, a readable console on a terminal."""

from __future__ import annotations

import logging
import sys
import time

import structlog


def level_for(verbosity: int) -> int:
    """Upstream verbosity (``-v``): 4 and above is debug (upstream's DEBUG level), else info."""
    return logging.DEBUG if verbosity >= 4 else logging.INFO


def _timestamper(fmt: str | None) -> structlog.typing.Processor:
    """The ``timestamp`` field in controller-runtime's ``--zap-time-encoding`` formats
    (default ISO 8601, UTC)."""
    if fmt in (None, "iso8601", "rfc3339", "rfc3339nano"):
        return structlog.processors.TimeStamper(fmt="iso", utc=True)
    scale = {"epoch": 1.0, "millis": 1e3, "nano": 1e9}[fmt]

    def stamp(_: object, __: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
        now = time.time() * scale
        event["timestamp"] = int(now) if fmt == "nano" else now
        return event

    return stamp


def configure(verbosity: int = 0, *, json: bool | None = None, level: int | None = None,
              time_format: str | None = None) -> None:
    """Configure structlog and stdlib logging once for a process (logs go to stderr).

    ``json`` None: JSON unless stderr is a terminal; ``level`` None: from ``verbosity``;
    ``time_format``: one of ``--zap-time-encoding``'s values (default ISO 8601)."""
    if json is None:
        json = not sys.stderr.isatty()
    level = level_for(verbosity) if level is None else level
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _timestamper(time_format),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
