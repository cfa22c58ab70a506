"""docs/compatibility.md's plugin table says what the registry really has: a type marked
supported is registered, a type marked "not yet" is pending (its config stops naming the
issue), and every registered or pending type has a row; its llm-d v0.10 column says what
epp/config/stability.py holds (upstream v0.10's stability level and deprecation)."""

from __future__ import annotations

import re
from pathlib import Path

from epp.config.builtins import builtin_registry
from epp.config.stability import v010_status

DOC = Path(__file__).resolve().parents[3] / "docs" / "compatibility.md"


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of the "## Plugins" table."""
    section = text.split("\n## Plugins\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`"):
            rows.append(cells)
    return rows


def plugin_rows(text: str) -> list[tuple[list[str], str]]:
    """(type names, status) of every row of the "## Plugins" table."""
    return [(re.findall(r"`([^`]+)`", c[0]), c[2]) for c in table_rows(text)]


def test_the_v010_column_matches_upstreams_registry() -> None:
    wrong = []
    for cells in table_rows(DOC.read_text()):
        assert len(cells) == 5, cells[0]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            if cells[3] != v010_status(name):
                wrong.append(f"{name}: documented {cells[3]!r}, upstream v0.10: "
                             f"{v010_status(name)!r}")
    assert not wrong, "\n".join(wrong)


def test_the_plugin_table_matches_the_registry() -> None:
    registry = builtin_registry()
    registered, pending = set(registry.types), set(registry.pending)
    rows = plugin_rows(DOC.read_text())
    wrong = []
    for names, status in rows:
        for name in names:
            if status.startswith("supported") and name not in registered:
                wrong.append(f"{name}: documented {status!r} but not registered")
            elif status.startswith("not yet") and name not in pending:
                wrong.append(f"{name}: documented {status!r} but "
                             + ("registered" if name in registered else "not pending"))
    listed = {name for names, _ in rows for name in names}
    wrong += [f"{name}: registered or pending but has no row"
              for name in sorted((registered | pending) - listed)]
    assert not wrong, "\n".join(wrong)


def test_the_row_parser_reads_names_and_status() -> None:
    text = ("# x\n\n## Plugins\n\n| type | from | status | v0.10 | notes |\n|---|---|---|---|---|\n"
            "| `a`, `b` | GIE | not yet (issue #1) | Beta | |\n\n## Metrics\n\n| `c` | x | y | |\n")
    assert plugin_rows(text) == [(["a", "b"], "not yet (issue #1)")]
