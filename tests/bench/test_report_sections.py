"""bench.report.write_section replaces one RESULTS.md section and keeps the others intact."""

from __future__ import annotations

from pathlib import Path

from bench.report import write_section


def test_a_section_is_replaced_in_place_with_the_blank_line_before_the_next(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## A\n\nold a\n\n## B\n\nb\n")
    write_section("## A", "## A\n\nnew a", results)
    assert results.read_text() == "# Benchmark results\n\n## A\n\nnew a\n\n## B\n\nb\n"


def test_a_missing_section_is_appended_and_the_last_one_ends_the_file(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## A\n\na\n")
    write_section("## C", "## C\n\nc\n", results)
    write_section("## C", "## C\n\nc2\n", results)
    assert results.read_text() == "# Benchmark results\n\n## A\n\na\n\n## C\n\nc2\n"
