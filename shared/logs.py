"""structlog setup: JSON lines in production, a readable console on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


def level_for(verbosity: int) -> int:
    """Upstream verbosity (``-v``): 4 and above is debug (upstream's DEBUG level), else info."""
    return logging.DEBUG if verbosity >= 4 else logging.INFO


def configure(verbosity: int = 0, *, json: bool | None = None) -> None:
    """Configure structlog and stdlib logging once for a process (logs go to stderr)."""
    if json is None:
        json = not sys.stderr.isatty()
    level = level_for(verbosity)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
