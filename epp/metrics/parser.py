"""A fast reader for the few families the EPP needs out of Prometheus text exposition.

A vLLM ``/metrics`` page is ~100 KB, mostly histograms we never look at, and it is read 20
times a second per endpoint. So instead of parsing every line, this searches the text for
``"\\n" + family name`` (a C-speed ``str.find``), and parses only those lines. Label values
may hold quotes, commas, braces and escapes (``\\\\``, ``\\"``, ``\\n``); values may be
``NaN``/``+Inf``/``-Inf``; an optional timestamp is ignored. A malformed line is skipped and
counted, never fatal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: its labels and value."""

    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class ScanResult:
    """Samples per wanted family (absent families have no key) and malformed line count."""

    families: dict[str, list[Sample]] = field(default_factory=dict)
    malformed: int = 0


def scan(text: str, names: Iterable[str]) -> ScanResult:
    """Samples of the families ``names`` (exact names; suffixed names do not match)."""
    result = ScanResult()
    for name in names:
        needle = "\n" + name
        n = len(name)
        # ``pos`` is where a line starting with the name begins; the first line has no "\n".
        if text.startswith(name):
            pos = 0
        else:
            hit = text.find(needle)
            pos = -1 if hit == -1 else hit + 1
        while pos != -1:
            after = pos + n
            if text[after : after + 1] in ("{", " ", "\t"):
                end = text.find("\n", after)
                if end == -1:
                    end = len(text)
                sample = parse_sample(text, after, end)
                if sample is None:
                    result.malformed += 1
                else:
                    result.families.setdefault(name, []).append(sample)
            hit = text.find(needle, after)
            pos = -1 if hit == -1 else hit + 1
    return result


def parse_sample(text: str, i: int, end: int) -> Sample | None:
    """The sample in ``text[i:end]`` (just after the family name); None when malformed."""
    labels: dict[str, str] = {}
    try:
        if text[i] == "{":
            i = _parse_labels(text, i + 1, end, labels)
        fields = text[i:end].split()
        if not fields or len(fields) > 2:
            return None
        return Sample(labels, float(fields[0]))
    except (ValueError, IndexError):
        return None


def _parse_labels(text: str, i: int, end: int, out: dict[str, str]) -> int:
    """Parse ``name="value",...}`` starting at ``i``; returns the index after ``}``."""
    while True:
        while i < end and text[i] in " \t,":
            i += 1
        if i >= end:
            raise ValueError("unterminated labels")
        if text[i] == "}":
            return i + 1
        eq = text.index("=", i, end)
        lname = text[i:eq].strip()
        i = eq + 1
        while text[i] in " \t":
            i += 1
        if text[i] != '"':
            raise ValueError("label value must be quoted")
        i += 1
        close = text.index('"', i, end)
        if "\\" not in text[i:close]:
            out[lname] = text[i:close]
            i = close + 1
            continue
        # Slow path, only for values with escapes: walk characters.
        buf: list[str] = []
        while True:
            c = text[i]
            if c == "\\":
                nxt = text[i + 1]
                buf.append(_ESCAPES.get(nxt, "\\" + nxt))
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                buf.append(c)
                i += 1
            if i >= end:
                raise ValueError("unterminated label value")
        out[lname] = "".join(buf)
