"""Command-line helpers with upstream (Go ``flag``) conventions: ``--flag=false``, ``50ms``."""

from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def duration(text: str) -> float:
    """A Go duration (``50ms``, ``1m30s``, ``2s``) in seconds; a bare number means seconds."""
    s = text.strip()
    try:
        return float(s)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (use e.g. 50ms, 2s, 1m30s)")
    return total


def boolean(text: str) -> bool:
    """Go's accepted spellings of a boolean flag value."""
    t = text.strip().lower()
    if t in ("1", "t", "true", "yes", "y", "on"):
        return True
    if t in ("0", "f", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r} (use true or false)")


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)

    def add_bool(self, *names: str, default: bool, help: str) -> None:
        """A boolean flag: ``--x`` (true), ``--x=false``, ``--x=true``."""
        self.add_argument(
            *names, nargs="?", const=True, default=default, type=boolean, metavar="BOOL",
            help=f"{help} (default {str(default).lower()})",
        )


def die(prog: str, message: str) -> NoReturn:
    """Exit non-zero with one clear line (bad config, unreadable file)."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.exit(1)
