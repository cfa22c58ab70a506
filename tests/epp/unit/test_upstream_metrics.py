"""llm-d-router v0.10.0's metrics: each one it exports is exported here with its name, type,
labels and buckets, or is listed in docs/metrics.md as not exported (with why); and the
behaviours behind the new names (label caps, pool standard deviations, processing times,
the streaming label) do what upstream's do.

The list of upstream metrics is our own data file (tests/epp/data), written from upstream's
docs/metrics.md and metric definitions, so this test needs no upstream checkout."""

from __future__ import annotations

import math
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

from epp import telemetry as m
from epp.config import build, parse_config
from epp.datastore import EndpointMetrics, parse_object
from epp.main import metrics_hooks
from epp.requestcontrol import Director
from tests.epp.unit.test_director import HEADERS, body, store
from tests.epp.unit.test_metrics_table import exported

ROOT = Path(__file__).parents[3]
UPSTREAM = yaml.safe_load(
    (ROOT / "tests" / "epp" / "data" / "llm-d-router-v0.10.0-metrics.yaml").read_text())
DOC = (ROOT / "docs" / "metrics.md").read_text()
NOT_EXPORTED = dict(re.findall(r"^\| `([a-z0-9_]+)` \| (.+) \|$",
                               DOC.split("## Upstream metrics not exported", 1)[1], re.M))


def upper_bounds(name: str) -> list[float] | None:
    """The declared buckets of histogram ``name`` (without +Inf), None for other types."""
    collector = REGISTRY._names_to_collectors.get(name)  # type: ignore[attr-defined]
    bounds = getattr(collector, "_upper_bounds", None)
    return None if bounds is None else [b for b in bounds if b != math.inf]


def test_the_upstream_list_is_whole() -> None:
    names = [e["name"] for e in UPSTREAM["metrics"]]
    assert len(names) == len(set(names)) > 100
    # every v0.10 family of upstream's docs/metrics.md catalog is represented
    for prefix in ("llm_d_epp_request_", "llm_d_epp_std_dev_", "llm_d_epp_flow_control_",
                   "llm_d_epp_extproc_", "llm_d_epp_inflight_", "llm_d_router_epp_kv_cache_",
                   "inference_objective_", "inference_pool_", "inference_extension_"):
        assert any(n.startswith(prefix) for n in names), prefix


@pytest.mark.parametrize("entry", UPSTREAM["metrics"], ids=lambda e: e["name"])
def test_each_upstream_metric_is_exported_as_upstream_has_it_or_documented_as_not(
        entry: dict[str, Any], live: dict[str, tuple[str, set[frozenset[str]]]]) -> None:
    name = entry["name"]
    if name in NOT_EXPORTED:
        assert name not in live, f"{name} is exported but docs/metrics.md says it is not"
        assert NOT_EXPORTED[name].strip(), f"{name}: no reason given"
        return
    assert name in live, f"{name} is neither exported nor listed as not exported"
    kind, label_sets = live[name]
    assert kind == entry["type"], name
    assert label_sets == {frozenset(entry["labels"])}, name
    if "buckets" in entry:
        assert upper_bounds(name) == [float(b) for b in entry["buckets"]], name


def test_nothing_listed_as_not_exported_is_missing_from_the_upstream_list() -> None:
    assert set(NOT_EXPORTED) <= {e["name"] for e in UPSTREAM["metrics"]}


@pytest.fixture(scope="module")
def live() -> dict[str, tuple[str, set[frozenset[str]]]]:
    return exported()


# -- label caps ---------------------------------------------------------------------------

def test_a_label_past_its_cap_reads_other_and_earlier_values_keep_theirs() -> None:
    cap = m.BoundedLabel(3)
    assert [cap.bound(v) for v in ("a", "b", "c", "d", "a", "e")] == [
        "a", "b", "c", "other", "a", "other"]
    assert cap.bound("") == ""  # an empty value is not a client's choice


def test_pinned_names_never_fold() -> None:
    cap = m.BoundedLabel(1)
    cap.bound("first")
    cap.pin("rewritten")
    assert cap.bound("rewritten") == "rewritten"
    assert cap.bound("another") == "other"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_requests_past_the_model_cap_are_counted_as_other_under_both_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(m, "MODEL_NAMES", m.BoundedLabel(1))
    monkeypatch.setattr(m, "FAIRNESS_IDS", m.BoundedLabel(1))
    d = Director.of(build(parse_config(None), store(), rng=random.Random(0)))
    before = sample("llm_d_epp_request_total", model_name="other", target_model_name="other",
                    fairness_id="other", priority="0")
    before_legacy = sample("inference_objective_request_total", model_name="other",
                           target_model_name="other", priority="0")
    # "capped-a" (client and target name alike) fills the model slot, "tenant-1" the fairness one
    for model, tenant in (("capped-a", "tenant-1"), ("capped-b", "tenant-2")):
        d.route({**HEADERS, "x-llm-d-inference-fairness-id": tenant},
                body_of(model), {})
    assert sample("llm_d_epp_request_total", model_name="capped-a",
                  target_model_name="capped-a", fairness_id="tenant-1", priority="0") >= 1
    assert sample("llm_d_epp_request_total", model_name="other", target_model_name="other",
                  fairness_id="other", priority="0") == before + 1
    assert sample("inference_objective_request_total", model_name="other",
                  target_model_name="other", priority="0") == before_legacy + 1


def test_a_rewritten_model_keeps_its_name_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(m, "MODEL_NAMES", m.BoundedLabel(0))  # everything else folds
    ds = store()
    rewrite = parse_object({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModelRewrite", "metadata": {"name": "rw-cap", "namespace": "default"},
        "spec": {"poolRef": {"name": "pool"}, "rules": [
            {"matches": [{"model": {"type": "Exact", "value": "pinned-m"}}],
             "targets": [{"modelRewrite": "pinned-m-v2"}]}]}})
    from dataclasses import replace
    snap = ds.snapshot
    ds.replace(replace(snap, rewrites=(rewrite,), _exact={"pinned-m": rewrite.rules[0].targets},
                       _exact_names={"pinned-m": "rw-cap"}))
    d = Director.of(build(parse_config(None), ds, rng=random.Random(0)))
    d.route(HEADERS, body_of("pinned-m"), {})
    assert sample("llm_d_epp_request_total", model_name="pinned-m",
                  target_model_name="pinned-m-v2", fairness_id="default-flow",
                  priority="0") >= 1


def body_of(model: str) -> bytes:
    return body().replace(b'"model":"m"', b'"model":"' + model.encode() + b'"')


# -- TTFT streaming label, streaming TPOT, ITL --------------------------------------------

def test_ttft_is_labelled_by_streaming_and_tpot_itl_only_count_streams() -> None:
    d = Director.of(build(parse_config(None), store(), rng=random.Random(0)))
    labels = {"model_name": "m", "target_model_name": "m", "fairness_id": "default-flow",
              "priority": "0"}
    ttft = "llm_d_epp_request_ttft_seconds_count"
    tpot, itl = ("llm_d_epp_request_streaming_tpot_seconds_count",
                 "llm_d_epp_request_streaming_itl_seconds_count")
    n_true, n_false = sample(ttft, **labels, streaming="true"), sample(
        ttft, **labels, streaming="false")
    n_tpot, n_itl = sample(tpot, **labels), sample(itl, **labels)

    _, routed = d.route(HEADERS, body(), {})  # not streamed
    d.response_received(routed, 200, {"content-type": "application/json"})
    d.finish(routed, completed=True, status=200, response_size=10, prompt_tokens=5,
             completion_tokens=3)
    assert sample(ttft, **labels, streaming="false") == n_false + 1
    assert sample(tpot, **labels) == n_tpot and sample(itl, **labels) == n_itl

    _, routed = d.route(HEADERS, body(), {})  # streamed: three chunks, two gaps
    d.response_received(routed, 200, {"content-type": "text/event-stream"})
    for _ in range(3):
        d.response_chunk(routed, b"data: {}\n\n", True)
        time.sleep(0.002)
    d.finish(routed, completed=True, status=200, response_size=30, prompt_tokens=5,
             completion_tokens=3)
    assert sample(ttft, **labels, streaming="true") == n_true + 1
    assert sample(tpot, **labels) == n_tpot + 1
    assert sample(itl, **labels) == n_itl + 2


# -- pool standard deviations --------------------------------------------------------------

def test_pool_std_dev_gauges_are_the_sample_deviation_rounded_to_2_decimals() -> None:
    ds = store()
    for view, (kv, waiting, running) in zip(ds.views(), ((0.1, 1, 2), (0.2, 4, 2), (0.6, 7, 2)),
                                            strict=False):
        view.begin_scrape()
        ds.record_scrape(view, EndpointMetrics(waiting=waiting, running=running, kv_usage=kv,
                                               updated_at=time.monotonic() + 3600))
    assert len(ds.views()) == 3
    families = {f.name: f.samples[0].value
                for f in m.PoolCollector("pool", ds).collect() if f.samples}
    assert families["llm_d_epp_std_dev_kv_cache_utilization"] == 0.26  # sqrt(0.07 / 2)
    assert families["llm_d_epp_std_dev_queue_size"] == 3.0
    assert families["llm_d_epp_std_dev_running_requests"] == 0.0
    assert families["llm_d_epp_average_queue_size"] == families[
        "inference_pool_average_queue_size"] == 4.0
    assert families["llm_d_epp_ready_endpoints"] == families["inference_pool_ready_pods"] == 3


def test_one_endpoint_has_no_spread() -> None:
    assert m.std_dev([0.5], 0.5) == 0.0
    assert m.std_dev([], 0.0) == 0.0


# -- hooks carry the plugin's identity -------------------------------------------------------

def test_prefix_hits_are_labelled_with_the_plugin_that_looked_up() -> None:
    runtime = build(parse_config(None), store(), hooks=metrics_hooks(), rng=random.Random(0))
    (kind, name, _), *_ = runtime.scheduler.prefix_indexer_sizes()
    before = sample("llm_d_epp_prefix_indexer_hit_ratio_count", plugin_name=name,
                    plugin_type=kind)
    d = Director.of(runtime)
    for _ in range(2):
        _, routed = d.route(HEADERS, body(), {})
        d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
                 completion_tokens=1)
    assert sample("llm_d_epp_prefix_indexer_hit_ratio_count", plugin_name=name,
                  plugin_type=kind) == before + 2


def test_the_counting_histogram_exposes_what_prometheus_clients_would() -> None:
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.core import REGISTRY as DEFAULT

    ours = m.CountingHistogram("test_counting_seconds", "t", ["a"], (0.01, 0.1, 1))
    registry = CollectorRegistry()
    theirs = Histogram("test_counting_seconds", "t", ["a"], buckets=(0.01, 0.1, 1),
                       registry=registry)
    try:
        for v in (0.005, 0.01, 0.05, 0.5, 5, 0.1):
            ours.labels("x").observe(v)
            theirs.labels("x").observe(v)
        want = {(s.name, tuple(sorted(s.labels.items())), s.value)
                for f in registry.collect() for s in f.samples
                if not s.name.endswith("_created")}
        got = {(s.name, tuple(sorted(s.labels.items())), s.value)
               for f in ours.collect() for s in f.samples}
        assert got == want
    finally:
        DEFAULT.unregister(ours)
