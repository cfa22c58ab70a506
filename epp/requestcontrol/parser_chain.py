"""``requestHandler.parsers`` (llm-d v0.10): several parsers on one route, each request
parsed by the one that claims its path.

A parser claims path suffixes (:attr:`epp.requestcontrol.plugin.Parser.paths`, e.g.
``chat/completions``). The first listed parser whose suffix ends the request's path (query
string and a trailing ``/`` ignored) parses it; a parser claiming no path is the fallback
for everything else, and parsers listed after a fallback are never reached (a warning says
so, as upstream's). A path nobody claims, with no fallback, is answered 404.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from epp.requestcontrol.grpcbody import GrpcResponseReader, Usage
from epp.requestcontrol.plugin import Parser
from shared.errors import NotFound
from shared.openai import OpenAIRequest

log = structlog.get_logger(__name__)

#: Distinct request paths whose parser is remembered (query strings make paths unbounded).
_REMEMBERED = 1024


def _suffix(text: str) -> str:
    return text.strip().strip("/")


class ParserChain(Parser, GrpcResponseReader):
    """Resolves a request path to one of ``parsers`` (see the module docstring)."""

    def __init__(self, parsers: Sequence[Parser], *, fallback: Parser | None = None) -> None:
        """``fallback``: the parser for paths none of ``parsers`` claims, whatever paths it
        claims itself (the default chain's ``openai-parser``)."""
        self.entries: list[tuple[Parser, tuple[str, ...]]] = []
        self.fallback: Parser | None = None
        self._resolved: dict[str, Parser] = {}
        seen: set[type] = set()
        for i, parser in enumerate(parsers):
            if type(parser) in seen:  # upstream keeps the first of each type
                log.warning("parser type listed twice; the later one is skipped",
                            parser=getattr(parser, "name", repr(parser)))
                continue
            seen.add(type(parser))
            paths = tuple(_suffix(p) for p in parser.paths)
            if not paths:
                self.fallback = parser
                for skipped in parsers[i + 1:]:
                    log.warning("parser listed after a fallback parser is never used",
                                parser=getattr(skipped, "name", repr(skipped)))
                break
            self.entries.append((parser, paths))
        if fallback is not None and self.fallback is None:
            self.fallback = fallback

    def resolve(self, path: str) -> Parser:
        """The parser for ``path``; :class:`NotFound` when none claims it."""
        # A route sees few distinct paths: remembered (bounded), the lookup is one dict get.
        found = self._resolved.get(path)
        if found is not None:
            return found
        clean = path.split("?", 1)[0].strip().rstrip("/")
        parser = next((p for p, suffixes in self.entries if clean.endswith(suffixes)),
                      self.fallback)
        if parser is None:
            raise NotFound(f"no parser is configured for path {clean!r}")
        if len(self._resolved) < _REMEMBERED:
            self._resolved[path] = parser
        return parser

    def parse(self, body: bytes, path: str) -> OpenAIRequest:
        return self.resolve(path).parse(body, path)

    def read_response(self, path: str, message: bytes, usage: Usage) -> None:
        try:
            parser = self.resolve(path)
        except NotFound:
            return
        if isinstance(parser, GrpcResponseReader):
            parser.read_response(path, message, usage)
