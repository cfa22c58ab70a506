"""The exported metrics match docs/metrics.md exactly: name, type and label names of every
row, and nothing exported under our prefixes that the table does not list. Series are made
the way the services make them: requests through a real director and a real BBR router."""

from __future__ import annotations

import asyncio
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
from devkit.valkey import ValkeyServer
from epp import telemetry as m
from epp.config import build, parse_config
from epp.datastore import parse_object
from epp.flowcontrol.eviction import default_eviction_metrics
from epp.flowcontrol.metrics import default_metrics as default_flow_control_metrics
from epp.flowcontrol.metrics import stale_endpoints_gauge
from epp.flowcontrol.program_aware import (
    attained_service_gauge,
    avg_wait_gauge,
    fairness_index_gauge,
)
from epp.main import metrics_hooks
from epp.requestcontrol import Director
from epp.requestcontrol.plugins.predicted_latency_producer import PredictedLatencyProducer
from epp.statestore import ValkeyStateStore, parse_store_url
from shared.errors import GatewayError
from tests.epp.unit.test_director import HEADERS, body, store
from tests.epp.unit.test_slo import LATENCY_CONFIG, trained

TABLE = Path(__file__).parents[3] / "docs" / "metrics.md"
ROW = re.compile(r"^\| (epp|bbr) \| `([a-z0-9_:]+)` \| (\w+) \|([^|]*)\|")


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    rows = {}
    for line in TABLE.read_text().splitlines():
        if match := ROW.match(line):
            _, name, kind, labels = match.groups()
            rows[name] = (kind, frozenset(re.findall(r"`(\w+)`", labels)))
    return rows


async def exercise_state_store() -> None:
    """A Valkey store that syncs with a real server, and one whose server is gone."""
    with ValkeyServer() as server:
        url = server.url
        store = ValkeyStateStore(parse_store_url(url), pool="metrics-table")
        await store.start()
        await store.close()
    gone = ValkeyStateStore(parse_store_url(url + "?timeout=0.2"), pool="metrics-table")
    await gone.start()
    await gone.close()


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
    exercise_slo_plugins()
    m.build_info("test", "")
    router = BodyRouter(build_bbr([], StaticBaseModels()))
    router.decide(b'{"model": "m"}')
    for raw in (b'{"model": ""}', b"{}", b"not json"):
        with pytest.raises(GatewayError):
            router.decide(raw)
    bbr_metrics.INFO.labels(commit="test", build_ref="").set(1)
    # Flow control's series, through the object its controller records with (one request
    # queued, one finished, one dispatch cycle); tests/epp/flowcontrol drive the real thing.
    fc = default_flow_control_metrics()
    fc.queued(("t", "0", "pool", "m", "m"), 10)
    fc.outcome(("t", "0", "Dispatched", "pool", "m", "m"), 0.01)
    fc.enqueued("t", "0", "Dispatched", 0.0001)
    fc.saturation("pool", 0.5)
    fc.dispatch_cycle.observe(0.0001)
    ev = default_eviction_metrics()  # in-flight eviction's series (v0.10 names)
    ev.issued.labels("pool", "10").inc()
    ev.outcomes.labels("pool", "confirmed").inc()
    ev.pending.labels("pool").set(0.1)
    attained_service_gauge().labels("agent").set(1.0)  # tests/epp/flowcontrol drive these
    avg_wait_gauge().labels("agent").set(1.0)
    fairness_index_gauge().set(1.0)
    stale_endpoints_gauge().labels("utilization-detector").set(0)
    asyncio.run(exercise_state_store())
    pool = m.PoolCollector("pool", runtime.datastore,
                           prefix_stats=lambda: runtime.scheduler.prefix_indexer_size,
                           prefix_sizes=runtime.scheduler.prefix_indexer_sizes)
    return list(pool.collect())


def exercise_slo_plugins() -> None:
    """A request with an SLO it misses, through upstream's predicted-latency config with a
    trained model: the predicted series and the violation counter."""
    runtime = build(parse_config(LATENCY_CONFIG), store(), rng=random.Random(0))
    (producer,) = runtime.handle.find(PredictedLatencyProducer)
    producer.predictor = trained()
    d = Director.of(runtime)
    _, routed = d.route({**HEADERS, "x-slo-ttft-ms": "0.001", "x-slo-tpot-ms": "0.001"},
                        body(), {})
    d.response_received(routed, 200, {"content-type": "text/event-stream"})
    d.response_chunk(routed, b"data: {}\n\n", True)
    d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=5,
             completion_tokens=3)


def exported() -> dict[str, tuple[str, set[frozenset[str]]]]:
    pool_families = exercise_both_services()
    text = generate_latest(REGISTRY).decode()
    families = list(text_string_to_metric_families(text)) + pool_families
    out: dict[str, tuple[str, set[frozenset[str]]]] = {}
    for fam in families:
        name = fam.name + "_total" if fam.type == "counter" else fam.name  # type: ignore[attr-defined]
        if not name.startswith(("inference_", "bbr_", "llm_d_")) or name.endswith("_created"):
            continue  # _created: the client library's creation time of each series
        label_sets = {frozenset(k for k in s.labels if k != "le")
                      for s in fam.samples}  # type: ignore[attr-defined]
        if not label_sets:  # a labelled family no code path has used yet: its declared labels
            collector = REGISTRY._names_to_collectors[name]  # type: ignore[attr-defined]
            label_sets = {frozenset(collector._labelnames)}
        out[name] = (fam.type, label_sets)  # type: ignore[attr-defined]
    return out


def test_every_documented_metric_is_exported_with_its_type_and_labels() -> None:
    table, live = documented(), exported()
    rows = [line for line in TABLE.read_text().splitlines() if line.startswith(("| epp", "| bbr"))]
    assert len(table) == len(rows) >= 24  # every row parsed
    for name, (kind, labels) in table.items():
        assert name in live, f"{name} is documented but not exported"
        live_kind, label_sets = live[name]
        assert live_kind == kind, f"{name}: exported as {live_kind}, documented as {kind}"
        assert label_sets == {labels}, f"{name}: labels {label_sets} != documented {labels}"


def test_nothing_is_exported_under_our_prefixes_that_the_table_does_not_list() -> None:
    assert set(exported()) - set(documented()) == set()
