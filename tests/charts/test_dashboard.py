"""The Grafana dashboard (charts/dashboards/inference-gateway.json) asks only for what the
services export: every panel's PromQL is parsed (``promql-parser``, the Rust parser Greptime
keeps), and each metric it selects must be on the ``/metrics`` page of a running ``epp``
(flow control on), ``bbr`` and ``vllm-sim``; each label it groups, matches or filters by must
be one docs/metrics.md gives that metric (a table test_metrics_table holds to the export)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devkit.envoy import free_port, wait_for_port
from devkit.manifests import pool_manifests, write_yaml
from tests.epp.unit.test_metrics_table import documented

promql_parser = pytest.importorskip("promql_parser", reason="promql-parser (test extra)")

ROOT = Path(__file__).parents[2]
DASHBOARD = ROOT / "charts" / "dashboards" / "inference-gateway.json"
#: Grafana's variables, as Grafana substitutes them before the query reaches Prometheus.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
#: Metrics documented outside docs/metrics.md's table, with their labels.
ELSEWHERE = {"llm_d_inference_scheduler_disagg_decision_total":  # docs/pd.md
             frozenset({"model_name", "decision_type"})}
FLOW_CONTROL = ("apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
                "kind: EndpointPickerConfig\nfeatureGates: [flowControl]\n")


def queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every target, rows' nested panels included."""
    out = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            walk(p.get("panels", []))
            out.extend((p["title"], t["expr"]) for t in p.get("targets", []))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return out


def selectors(expr: Any) -> Iterator[tuple[str, set[str]]]:
    """(metric name, labels named) for every series selector in a parsed query; the labels
    of an aggregation or a vector match are attributed to each selector below it."""
    if isinstance(expr, promql_parser.VectorSelector):
        labels = {m.name for m in expr.matchers.matchers if m.name != "__name__"}
        names = [expr.name] if expr.name else [
            m.value for m in expr.matchers.matchers if m.name == "__name__"]
        for name in names:
            yield name, labels
        return
    if isinstance(expr, promql_parser.MatrixSelector):
        yield from selectors(expr.vector_selector)
        return
    grouping: set[str] = set()
    children: list[Any] = []
    if isinstance(expr, promql_parser.AggregateExpr):
        children = [expr.expr, expr.param]
        grouping = set(expr.modifier.labels) if expr.modifier is not None and \
            expr.modifier.type == promql_parser.AggModifierType.By else set()
    elif isinstance(expr, promql_parser.BinaryExpr):
        children = [expr.lhs, expr.rhs]
        matching = expr.modifier.matching if expr.modifier is not None else None
        if matching is not None and matching.type == promql_parser.LabelModifierType.Include:
            grouping = set(matching.labels)
    elif isinstance(expr, promql_parser.Call):
        children = list(expr.args)
    elif isinstance(expr, (promql_parser.ParenExpr, promql_parser.UnaryExpr,
                           promql_parser.SubqueryExpr)):
        children = [expr.expr]
    for child in children:
        for name, labels in selectors(child) if child is not None else ():
            yield name, labels | grouping


def parse(expr: str) -> Any:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return promql_parser.parse(expr)


def exported_series(text: str) -> set[str]:
    """Every series name a page can have, from its ``# TYPE`` lines (a labelled metric with
    no series yet still declares itself)."""
    names = set()
    for kind_line in re.finditer(r"(?m)^# TYPE (\S+) (\w+)$", text):
        name, kind = kind_line.groups()
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        elif kind == "summary":
            names |= {name, f"{name}_sum", f"{name}_count"}
        elif kind == "counter":
            names |= {name if name.endswith("_total") else f"{name}_total"}
        else:
            names.add(name)
    return names


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """What a real epp, bbr and vllm-sim serve on /metrics."""
    tmp = tmp_path_factory.mktemp("dashboard")
    sim_port, epp_ports, bbr_ports = free_port(), [free_port() for _ in range(3)], [
        free_port() for _ in range(3)]
    write_yaml(tmp / "pool.yaml", pool_manifests("pool", [("pod-0", "127.0.0.1")], sim_port))
    (tmp / "epp.yaml").write_text(FLOW_CONTROL)
    py = sys.executable
    commands = {
        "sim": ([py, "-m", "sim.main", "--host", "127.0.0.1", "--port", str(sim_port),
                 "--model", "m", "--log-level", "warning"], sim_port),
        "epp": ([py, "-m", "epp.main", "--manifests", str(tmp / "pool.yaml"), "--pool-name",
                 "pool", "--config-file", str(tmp / "epp.yaml"), "--secure-serving=false",
                 "--bind-address", "127.0.0.1", "--grpc-port", str(epp_ports[0]),
                 "--grpc-health-port", str(epp_ports[1]), "--metrics-port", str(epp_ports[2])],
                epp_ports[2]),
        "bbr": ([py, "-m", "bbr.main", "--secure-serving=false", "--bind-address", "127.0.0.1",
                 "--grpc-port", str(bbr_ports[0]), "--grpc-health-port", str(bbr_ports[1]),
                 "--metrics-port", str(bbr_ports[2])], bbr_ports[2]),
    }
    procs = {name: subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name, (cmd, _) in commands.items()}
    try:
        names: set[str] = set()
        for _, port in commands.values():
            wait_for_port(port, timeout=60)
            names |= exported_series(httpx.get(f"http://127.0.0.1:{port}/metrics",
                                               timeout=10).text)
        yield names
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(15)


QUERIES = queries()


def test_the_dashboard_has_a_row_for_each_service() -> None:
    rows = [p["title"] for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] == "row"]
    assert any("EPP" in r for r in rows) and any("BBR" in r for r in rows)
    assert len(QUERIES) >= 40


@pytest.mark.parametrize(("title", "expr"), QUERIES, ids=[f"{t}:{e[:40]}" for t, e in QUERIES])
def test_every_query_parses_and_names_exported_metrics(exported: set[str], title: str,
                                                       expr: str) -> None:
    found = list(selectors(parse(expr)))
    assert found, f"{title}: selects no metric"
    missing = sorted({name for name, _ in found} - exported)
    assert not missing, f"{title}: not exported: {missing}"


@pytest.mark.parametrize(("title", "expr"), QUERIES, ids=[f"{t}:{e[:40]}" for t, e in QUERIES])
def test_every_label_a_query_uses_is_one_the_metric_has(title: str, expr: str) -> None:
    table = documented()
    for name, labels in selectors(parse(expr)):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        row = table.get(name) or table.get(base)
        known = row[1] if row is not None else ELSEWHERE.get(name)
        if known is None:  # the model servers' (vLLM's) names: not in our table
            assert name.startswith("vllm:"), f"{title}: {name} is not in docs/metrics.md"
            continue
        allowed = known | ({"le"} if name.endswith("_bucket") else set())
        assert labels <= allowed, f"{title}: {name} has no label(s) {sorted(labels - allowed)}"


def test_a_query_for_a_name_nobody_exports_fails(exported: set[str]) -> None:
    """The check itself: a misspelt name (upstream's old BBR counter) is caught."""
    names = {n for n, _ in selectors(parse("sum(rate(bbr_model_not_in_body_total[5m]))"))}
    assert names - exported == {"bbr_model_not_in_body_total"}


def test_a_label_the_metric_lacks_fails() -> None:
    """The check itself: grouping BBR's counter by a label it does not have is caught."""
    ((name, labels),) = selectors(parse("sum by(model_name) (rate(bbr_success_total[5m]))"))
    assert name == "bbr_success_total" and not labels <= documented()[name][1]
