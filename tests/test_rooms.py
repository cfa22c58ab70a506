"""The layout shows the architecture: each room holds only what its name says.

- ``shared/`` is the protocol package both services use (nothing only one of them needs);
  it imports nothing from ``devkit/`` (local gateway tooling), ``bench/`` or ``tests/``.
  What the EPP, the sidecar and the simulator share with the model servers is ``modelserver/``.
- ``bench/`` holds benchmarks only; whatever sets up a gateway lives in ``devkit/``.
- imports run down the floors only: nothing imports ``bench/``, the services and the
  simulator import nothing from ``devkit/``, and no modules import each other in a circle
  (``TYPE_CHECKING`` imports included: they tie the modules as much as the others do).
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


#: the rooms of the product and its tooling, the lower floors first
ROOMS = ("shared", "modelserver", "bbr", "epp", "sim", "sidecar", "devkit", "bench")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph() -> dict[str, set[str]]:
    """First-party module -> the first-party modules it imports (a package's ``__init__``
    counts as the package; ``from pkg import name`` counts as ``pkg.name`` when that is a
    module, else as ``pkg``)."""
    files = {module_name(p): p for room in ROOMS for p in python_files(room)}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = path.relative_to(ROOT).with_suffix("").parts[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package[:len(package) - node.level + 1], base]).strip(".")
                for alias in node.names:
                    deps.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base)
        graph[name] = {m for m in deps if m in files and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_imports_run_down_the_floors() -> None:
    graph = module_graph()
    bad = [f"{a} imports {b}" for a, deps in sorted(graph.items()) for b in sorted(deps)
           if (b.split(".")[0] == "bench" and a.split(".")[0] != "bench")
           or (b.split(".")[0] == "devkit" and a.split(".")[0] not in {"devkit", "bench"})]
    assert not bad, bad


def test_no_modules_import_each_other_in_a_circle() -> None:
    found = circles(module_graph())
    assert not found, found


def test_the_circle_check_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]


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


#: shared/ modules neither service imports, with why they stay there
SHARED_TOOLS = {"shared.otelproto": "run by the Makefile and the Dockerfile at install time"}


def test_shared_holds_only_what_both_services_use() -> None:
    """Every module of ``shared/`` is used by BBR and by the EPP (directly or through another
    shared module); what only some services share with the model servers is ``modelserver/``."""
    graph = module_graph()

    def reach(room: str) -> set[str]:
        seen: set[str] = set()
        todo = [m for m in graph if m.split(".")[0] == room]
        while todo:
            for dep in graph[todo.pop()]:
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    both = reach("bbr") & reach("epp")
    unused = sorted(m for m in graph if m.split(".")[0] == "shared" and m != "shared"
                    and m not in both and m not in SHARED_TOOLS)
    assert not unused, f"not used by both services: {unused}"
    assert not [m for m in graph if m.startswith("modelserver.")
                and {d.split(".")[0] for d in graph[m]} - {"modelserver", "shared"}]
