"""Command-line helpers with upstream (Go ``flag``) conventions: ``--flag=false``, ``50ms``."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

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


_SIZE_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10**3, "k": 10**3,
               "M": 10**6, "G": 10**9, "": 1}
_SIZE = re.compile(r"^(\d+)(Ki|Mi|Gi|K|k|M|G|)$")


def byte_size(text: str) -> int:
    """A size in bytes written as upstream's gRPC size flags take it: a Kubernetes quantity
    with an optional trailing ``B`` (``4194304``, ``10MiB`` = 10 x 2^20, ``25MB`` = 25 x
    10^6)."""
    s = text.strip()
    if len(s) > 1 and s[-1] in "Bb":
        s = s[:-1]
    m = _SIZE.match(s)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r} (use e.g. 4194304, 10MiB, 25MB)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def boolean(text: str) -> bool:
    """Go's accepted spellings of a boolean flag value."""
    t = text.strip().lower()
    if t in ("1", "t", "true", "yes", "y", "on"):
        return True
    if t in ("0", "f", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r} (use true or false)")


class _Store(argparse.Action):
    """argparse's ``store``, also noting the flag in ``namespace.given_flags`` (so a service
    can warn about a deprecated flag only when it was written, never for its default)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        given = getattr(namespace, "given_flags", None)
        if given is None:
            given = set()
            namespace.given_flags = given
        given.add(self.dest)


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2, and records which flags were
    given (``args.given_flags``, a set of dests)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if args and args[0].startswith("-") and "action" not in kwargs:
            kwargs["action"] = _Store
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        if namespace is None:
            namespace = argparse.Namespace(given_flags=set())
        return super().parse_known_args(args, namespace)

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
