"""``core-metrics-extractor`` ``customMetrics`` → numeric endpoint attributes, and the two
plugins reading them: ``endpoint-attribute-filter`` and ``endpoint-attribute-scorer``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from epp.config.builtins import builtin_registry
from epp.datalayer.custom_metrics import ScalarAttributes, publish_scalars
from epp.datastore import EndpointView
from epp.scheduling import LLMRequest
from shared.plugins import PluginError

PAGE = """\
# TYPE custom_queue_size gauge
custom_queue_size{status="waiting"} 4
custom_running_size 2
custom_cache_utilization 0.5
custom_queue_depth{tier="gold"} 7
custom_queue_depth{tier="silver"} 9
"""
ENGINE = {"name": "my-engine", "queuedRequestsSpec": "custom_queue_size{status=waiting}",
          "runningRequestsSpec": "custom_running_size",
          "kvUsageSpec": "custom_cache_utilization",
          "customMetrics": [{"attributeKey": "custom.queue_depth",
                             "metricSpec": "custom_queue_depth{tier=gold}"},
                            {"attributeKey": "custom.absent", "metricSpec": "nothing_here"}]}


def plugin(type_name: str, **params: Any) -> Any:
    return builtin_registry().create(type_name, "", params)


def with_attr(view: EndpointView, **values: float) -> EndpointView:
    publish_scalars(view, "test", {k.replace("_", "."): v for k, v in values.items()})
    return view


def req() -> LLMRequest:
    return LLMRequest(request_id="r", target_model="m")


def test_custom_metrics_become_endpoint_attributes(make_view) -> None:
    extractor = plugin("core-metrics-extractor", engineConfigs=[ENGINE])
    view = make_view(1, labels={"inference.networking.k8s.io/engine-type": "my-engine"})
    parsed = extractor.extract(PAGE, view, time.monotonic())
    assert parsed.metrics.waiting == 4 and parsed.metrics.running == 2
    attrs = view.attribute(ScalarAttributes)
    assert attrs is not None and attrs.values == {"custom.queue_depth": 7.0}


def test_custom_metrics_refuse_a_bad_spec_or_a_repeated_key() -> None:
    bad = dict(ENGINE, customMetrics=[{"attributeKey": "k", "metricSpec": "a{b~c}"}])
    with pytest.raises(PluginError, match="customMetrics 'k'"):
        plugin("core-metrics-extractor", engineConfigs=[bad])
    twice = dict(ENGINE, customMetrics=[{"attributeKey": "k", "metricSpec": "a"}] * 2)
    with pytest.raises(PluginError, match="given twice"):
        plugin("core-metrics-extractor", engineConfigs=[twice])


def test_attribute_filter_threshold_and_on_missing(make_view) -> None:
    low, high, bare = (with_attr(make_view(1), custom_q=3), with_attr(make_view(2), custom_q=12),
                       make_view(3))
    algo = {"type": "threshold", "threshold": {"operator": "LessThan", "value": 10}}
    keep = plugin("endpoint-attribute-filter", attribute="custom.q", algorithm=algo)
    drop = plugin("endpoint-attribute-filter", attribute="custom.q", algorithm=algo,
                  onMissing="Fail")
    assert list(keep.filter(req(), [low, high, bare])) == [low, bare]
    assert list(drop.filter(req(), [low, high, bare])) == [low]


@pytest.mark.parametrize(("op", "kept"), [
    ("LessThan", [1]), ("LessThanOrEqual", [1, 2]), ("GreaterThan", [3]),
    ("GreaterThanOrEqual", [2, 3]), ("Equal", [2]), ("NotEqual", [1, 3])])
def test_attribute_filter_operators(make_view, op: str, kept: list[int]) -> None:
    views = [with_attr(make_view(i), custom_q=float(i)) for i in (1, 2, 3)]
    f = plugin("endpoint-attribute-filter", attribute="custom.q",
               algorithm={"type": "threshold", "threshold": {"operator": op, "value": 2}})
    assert [int(v.endpoint.address.rsplit(".", 1)[1]) for v in f.filter(req(), views)] == kept


def test_attribute_filter_fallback_on_empty(make_view) -> None:
    views = [with_attr(make_view(1), custom_q=50)]
    algo = {"type": "threshold", "threshold": {"operator": "LessThan", "value": 10}}
    assert list(plugin("endpoint-attribute-filter", attribute="custom.q",
                       algorithm=algo).filter(req(), views)) == []
    assert list(plugin("endpoint-attribute-filter", attribute="custom.q", algorithm=algo,
                       fallbackOnEmpty=True).filter(req(), views)) == views


@pytest.mark.parametrize(("params", "why"), [
    ({"algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 1}}},
     "attribute is required"),
    ({"attribute": "a", "algorithm": {"type": "percentile"}}, "must be one of"),
    ({"attribute": "a", "algorithm": {"type": "threshold"}}, "operator and value"),
    ({"attribute": "a", "onMissing": "Skip",
      "algorithm": {"type": "threshold", "threshold": {"operator": "Equal", "value": 1}}},
     "must be one of"),
])
def test_attribute_filter_refuses_bad_parameters(params: dict[str, Any], why: str) -> None:
    with pytest.raises(PluginError, match=why):
        plugin("endpoint-attribute-filter", **params)


def test_attribute_scorer_adaptive_range(make_view) -> None:
    views = [with_attr(make_view(1), custom_q=2), with_attr(make_view(2), custom_q=6),
             with_attr(make_view(3), custom_q=4), make_view(4)]
    lower = plugin("endpoint-attribute-scorer", attributeKey="custom.q",
                   algorithm={"type": "linear_lower_is_better"})
    higher = plugin("endpoint-attribute-scorer", attributeKey="custom.q",
                    algorithm={"type": "linear_higher_is_better",
                               "normalization": {"adaptiveRange": {}}})
    assert list(lower.score(req(), views)) == [1.0, 0.0, 0.5, 0.0]
    assert list(higher.score(req(), views)) == [0.0, 1.0, 0.5, 0.0]
    same = [with_attr(make_view(1), custom_q=3), with_attr(make_view(2), custom_q=3)]
    assert list(lower.score(req(), same)) == [1.0, 1.0]


def test_attribute_scorer_fixed_range_clamps(make_view) -> None:
    views = [with_attr(make_view(1), custom_kv=0.25), with_attr(make_view(2), custom_kv=1.5)]
    s = plugin("endpoint-attribute-scorer", attributeKey="custom.kv",
               algorithm={"type": "linear_lower_is_better",
                          "normalization": {"fixedRange": {"min": 0, "max": 1}}})
    assert list(s.score(req(), views)) == [0.75, 0.0]


@pytest.mark.parametrize(("params", "why"), [
    ({"algorithm": {"type": "linear_lower_is_better"}}, "attributeKey is required"),
    ({"attributeKey": "a"}, "algorithm.type is required"),
    ({"attributeKey": "a", "algorithm": {"type": "linear_lower_is_better", "normalization": {
        "fixedRange": {"min": 1, "max": 1}}}}, "min < max"),
    ({"attributeKey": "a", "algorithm": {"type": "linear_lower_is_better", "normalization": {
        "fixedRange": {"min": 0, "max": 1}, "adaptiveRange": {}}}}, "at most one"),
])
def test_attribute_scorer_refuses_bad_parameters(params: dict[str, Any], why: str) -> None:
    with pytest.raises(PluginError, match=why):
        plugin("endpoint-attribute-scorer", **params)
