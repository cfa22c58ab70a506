"""The exported metrics match docs/metrics.md exactly: name, type and label names of every
row, and nothing exported under our prefixes that the table does not list. Series are made
the way the services make them: requests through a real director and a real BBR router."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bbr import metrics as bbr_metrics
from bbr.basemodels import StaticBaseModels
from bbr.plugins import build as build_bbr
from bbr.router import BodyRouter
from epp import telemetry as m
from epp.config import build, parse_config
from epp.datastore import parse_object
from epp.main import metrics_hooks
from epp.requestcontrol import Director
from shared.errors import GatewayError
from tests.epp.unit.test_director import HEADERS, body, store

TABLE = Path(__file__).parents[3] / "docs" / "metrics.md"
ROW = re.compile(r"^\| (epp|bbr) \| `([a-z0-9_:]+)` \| (\w+) \|([^|]*)\|")


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    rows = {}
    for line in TABLE.read_text().splitlines():
        if match := ROW.match(line):
            _, name, kind, labels = match.groups()
            rows[name] = (kind, frozenset(re.findall(r"`(\w+)`", labels)))
    return rows


def exercise_both_services() -> list[object]:
    """Requests of every outcome through the EPP's director and the BBR's router; returns
    the pool collector's families (collected at scrape time, like the metrics port does)."""
    ds = store()
    rewrite = parse_object({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModelRewrite",
        "metadata": {"name": "rw", "namespace": "default"},
        "spec": {"poolRef": {"name": "pool"}, "rules": [
            {"matches": [{"model": {"type": "Exact", "value": "m"}}],
             "targets": [{"modelRewrite": "m-v2"}]}]}})
    snap = ds.snapshot
    ds.replace(replace(snap, rewrites=(rewrite,), _exact={"m": rewrite.rules[0].targets},
                       _exact_names={"m": "rw"}))
    runtime = build(parse_config(None), ds, hooks=metrics_hooks(), rng=random.Random(0))
    d = Director.of(runtime)
    for completed, status in ((True, 200), (True, 500), (False, 200)):
        _, routed = d.route(HEADERS, body(), {})
        d.response_chunk(routed, b"data: {}\n\n", True)
        d.finish(routed, completed=completed, status=status, response_size=10,
                 prompt_tokens=5, completion_tokens=3, cached_tokens=2)
    pending = d.prepare(HEADERS, body(), {})
    pending.candidates = ()
    with pytest.raises(GatewayError):
        d.dispatch(pending)  # a scheduling failure
    d.count_error({"x-gateway-model-name": "m"}, GatewayError("refused"))
    # The state store's series exist only with a store configured; make one of each so the
    # table is checked whatever ran before (tests/epp/statestore/ runs real ones).
    from epp.statestore import metrics as store_metrics

    for metric in (store_metrics.OPERATIONS, store_metrics.ERRORS):
        metric.labels("valkey", "push").inc(0)
    store_metrics.LATENCY.labels("valkey", "push").observe(0.001)
    store_metrics.UP.labels("valkey").set(1)
    store_metrics.BACKLOG.labels("valkey").set(0)
    m.INFO.labels(commit="test", build_ref="").set(1)
    router = BodyRouter(build_bbr([], StaticBaseModels()))
    for raw in (b'{"model": "m"}', b'{"model": ""}', b"{}"):
        router.decide(raw)
    with pytest.raises(GatewayError):
        router.decide(b"not json")
    bbr_metrics.INFO.labels(version="test").set(1)
    pool = m.PoolCollector("pool", runtime.datastore,
                           prefix_stats=lambda: runtime.scheduler.prefix_indexer_size)
    return list(pool.collect())


def exported() -> dict[str, tuple[str, set[frozenset[str]]]]:
    pool_families = exercise_both_services()
    text = generate_latest(REGISTRY).decode()
    families = list(text_string_to_metric_families(text)) + pool_families
    out: dict[str, tuple[str, set[frozenset[str]]]] = {}
    for fam in families:
        name = fam.name + "_total" if fam.type == "counter" else fam.name  # type: ignore[attr-defined]
        if not name.startswith(("inference_", "bbr_")) or name.endswith("_created"):
            continue  # _created: the client library's creation time of each series
        label_sets = {frozenset(k for k in s.labels if k != "le")
                      for s in fam.samples}  # type: ignore[attr-defined]
        out[name] = (fam.type, label_sets)  # type: ignore[attr-defined]
    return out


def test_every_documented_metric_is_exported_with_its_type_and_labels() -> None:
    table, live = documented(), exported()
    assert len(table) == 37
    for name, (kind, labels) in table.items():
        assert name in live, f"{name} is documented but not exported"
        live_kind, label_sets = live[name]
        assert live_kind == kind, f"{name}: exported as {live_kind}, documented as {kind}"
        assert label_sets == {labels}, f"{name}: labels {label_sets} != documented {labels}"


def test_nothing_is_exported_under_our_prefixes_that_the_table_does_not_list() -> None:
    assert set(exported()) - set(documented()) == set()
