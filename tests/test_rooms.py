"""The layout shows the architecture: each room holds only what its name says.

- ``shared/`` is the protocol package the services use; it imports nothing from ``devkit/``
  (local gateway tooling), ``bench/`` or ``tests/``.
- ``bench/`` holds benchmarks only; whatever sets up a gateway lives in ``devkit/``.
- conftest files only register fixtures; helpers live in ``tests/support/`` and no test
  module imports a conftest.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: module names that set up a gateway; they belong in devkit/, never in bench/
GATEWAY_SETUP = {"envoy", "stack", "manifests", "gateway", "faultkit", "topology", "net"}


def python_files(room: str) -> Iterator[Path]:
    yield from (p for p in (ROOT / room).rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    return imports_of(path.read_text(), path.relative_to(ROOT).with_suffix("").parts[:-1])


def imports_of(source: str, package: tuple[str, ...]) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, as absolute names."""
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], base]).strip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_shared_imports_no_tooling() -> None:
    bad = [f"{p.relative_to(ROOT)} imports {m}"
           for p in python_files("shared") for m in sorted(imported_modules(p))
           if m.split(".")[0] in {"devkit", "bench", "tests"}]
    assert not bad, bad


def test_bench_holds_no_gateway_setup() -> None:
    bad = [str(p.relative_to(ROOT)) for p in python_files("bench") if p.stem in GATEWAY_SETUP]
    assert not bad, f"gateway-setup modules belong in devkit/: {bad}"
    assert (ROOT / "devkit" / "envoy.py").is_file() and (ROOT / "devkit" / "stack.py").is_file()


def test_no_test_module_imports_a_conftest() -> None:
    bad = [f"{p.relative_to(ROOT)} imports {m}"
           for p in python_files("tests") for m in sorted(imported_modules(p))
           if "conftest" in m.split(".")]
    assert not bad, bad


def test_the_checks_see_a_violation() -> None:
    """The scan finds plain, from- and relative imports, so the checks above can fail."""
    source = "import devkit.envoy\nfrom tests.sim import conftest\nfrom . import conftest\n"
    found = imports_of(source, ("tests", "support"))
    assert {"devkit.envoy", "tests.sim.conftest", "tests.support.conftest"} <= found
