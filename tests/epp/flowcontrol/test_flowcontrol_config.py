"""The ``flowControl`` section: upstream's shape, defaults and units; every bad input is an
error naming its path."""

from __future__ import annotations

import re

import pytest
import yaml
from prometheus_client import CollectorRegistry

from epp.config import builtin_registry
from epp.flowcontrol import (
    FlowControlConfig,
    FlowControlConfigError,
    FlowController,
    FlowControlMetrics,
    PriorityBandConfig,
)
from epp.flowcontrol.config import DEFAULT_BAND_MAX_BYTES, parse_go_duration, parse_quantity
from epp.flowcontrol.policies import PriorityUsageLimit, RoundRobinFairness, StaticUsageLimit
from shared.plugins import PluginError

# Upstream's documented example (site-src/guides/epp-configuration/config-text.md).
UPSTREAM_EXAMPLE = """
flowControl:
  maxBytes: 10Gi
  defaultRequestTTL: 60s
  defaultPriorityBand:
    maxBytes: 10Gi
    maxRequests: 5000
  priorityBands:
  - priority: 100
    maxBytes: 5Gi
    maxRequests: 500
    orderingPolicyRef: fcfs-ordering-policy
    fairnessPolicyRef: global-strict-fairness-policy
"""


def parse(text: str) -> FlowControlConfig:
    return FlowControlConfig.from_dict(yaml.safe_load(text)["flowControl"])


def error(raw: object) -> str:
    with pytest.raises(FlowControlConfigError) as e:
        FlowControlConfig.from_dict(raw)
    return str(e.value)


def test_upstream_example_parses_with_its_units() -> None:
    c = parse(UPSTREAM_EXAMPLE)
    assert c.max_bytes == 10 * 2**30
    assert c.max_requests == 0
    assert c.default_request_ttl == 60.0
    assert c.default_priority_band == PriorityBandConfig(max_bytes=10 * 2**30, max_requests=5000)
    assert c.priority_bands == (PriorityBandConfig(
        priority=100, max_bytes=5 * 2**30, max_requests=500,
        ordering_policy_ref="fcfs-ordering-policy",
        fairness_policy_ref="global-strict-fairness-policy"),)


def test_absent_section_gives_upstream_defaults() -> None:
    c = FlowControlConfig.from_dict(None)
    assert (c.max_bytes, c.max_requests, c.default_request_ttl) == (0, 0, 60.0)
    band = c.band(3)
    assert band.priority == 3
    assert band.effective_max_bytes == DEFAULT_BAND_MAX_BYTES == 1_000_000_000
    assert band.effective_max_requests == 5000  # bounded by default (v0.10)
    assert (c.enable_eviction, c.saturation_detector_ref, c.no_endpoint_request_ttl) == \
        (False, None, None)
    assert band.fairness_policy_ref == "global-strict-fairness-policy"
    assert band.ordering_policy_ref == "fcfs-ordering-policy"
    assert c.usage_limit_policy_ref == "static-usage-limit-policy"


def test_unlisted_priority_takes_the_template_listed_one_its_own() -> None:
    c = parse(UPSTREAM_EXAMPLE)
    assert c.band(100).max_requests == 500
    assert c.band(-1) == PriorityBandConfig(priority=-1, max_bytes=10 * 2**30,
                                            max_requests=5000)


@pytest.mark.parametrize(("raw", "value"), [
    (100, 100), ("100", 100), ("1k", 1000), ("500M", 500_000_000), ("2Gi", 2 * 2**30),
    ("1Ki", 1024), ("1e3", 1000), ("1.5", 2), ("100m", 1), ("0", 0), (None, 0),
    ("1E2", 100), (" 3Mi ", 3 * 2**20),
])
def test_quantities_read_like_kubernetes(raw: object, value: int) -> None:
    assert parse_quantity(raw, "x") == value


@pytest.mark.parametrize("raw", ["-1", -5, "10GB", "lots", True, [], "1..2", float("inf")])
def test_bad_quantities_are_errors(raw: object) -> None:
    with pytest.raises(FlowControlConfigError, match=r"^flowControl\.maxBytes: "):
        FlowControlConfig.from_dict({"maxBytes": raw})


@pytest.mark.parametrize(("raw", "seconds"), [
    ("30s", 30.0), ("500ms", 0.5), ("1m30s", 90.0), ("1h", 3600.0), ("0", 0.0), (None, 0.0),
])
def test_ttl_reads_go_durations(raw: object, seconds: float) -> None:
    assert parse_go_duration(raw, "x") == seconds


@pytest.mark.parametrize(("raw", "reason"), [
    ("30", "missing unit"), (30, "duration string"), ("soon", "invalid duration"),
    ("-1s", "invalid duration"),
])
def test_bad_ttls_are_errors(raw: object, reason: str) -> None:
    assert reason in error({"defaultRequestTTL": raw})


@pytest.mark.parametrize(("raw", "path"), [
    ({"maxByte": 1}, "flowControl.maxByte: unknown field"),
    ({"priorityBands": [{"priority": 1, "fairness": "x"}]},
     "flowControl.priorityBands[0].fairness: unknown field"),
    ({"defaultPriorityBand": {"maxRequest": 1}},
     "flowControl.defaultPriorityBand.maxRequest: unknown field"),
    ({"priorityBands": [{"maxBytes": 1}]}, "flowControl.priorityBands[0].priority: required"),
    ({"priorityBands": [{"priority": "high"}]},
     "flowControl.priorityBands[0].priority: must be an integer"),
    ({"priorityBands": [{"priority": True}]},
     "flowControl.priorityBands[0].priority: must be an integer"),
    ({"priorityBands": [{"priority": 1}, {"priority": 1}]},
     "flowControl.priorityBands[1].priority: duplicate priority 1"),
    ({"priorityBands": {"priority": 1}}, "flowControl.priorityBands: must be a list"),
    ({"defaultPriorityBand": {"priority": 1}}, "flowControl.defaultPriorityBand.priority:"),
    ({"priorityBands": [{"priority": 1, "fairnessPolicyRef": 3}]},
     "flowControl.priorityBands[0].fairnessPolicyRef: must be a plugin name"),
    ({"usageLimitPolicyPluginRef": ["a"]},
     "flowControl.usageLimitPolicyPluginRef: must be a plugin name"),
    ([1, 2], "flowControl: must be a mapping"),
])
def test_bad_structure_names_the_path(raw: object, path: str) -> None:
    assert error(raw).startswith(path)


def controller(config: FlowControlConfig, **kw: object) -> FlowController:
    return FlowController(config, lambda: 0.0, metrics=FlowControlMetrics(CollectorRegistry()),
                          **kw)  # type: ignore[arg-type]


def test_unknown_policy_ref_fails_at_construction_naming_the_path() -> None:
    c = FlowControlConfig.from_dict(
        {"priorityBands": [{"priority": 1, "orderingPolicyRef": "lifo"}]})
    with pytest.raises(FlowControlConfigError,
                       match=r"^flowControl\.priorityBands\[0\]\.orderingPolicyRef: no plugin "
                             r"named 'lifo'"):
        controller(c)


def test_template_policy_refs_are_checked_up_front() -> None:
    c = FlowControlConfig.from_dict({"defaultPriorityBand": {"fairnessPolicyRef": "nope"}})
    with pytest.raises(FlowControlConfigError,
                       match=r"^flowControl\.defaultPriorityBand\.fairnessPolicyRef"):
        controller(c)


def test_ref_to_a_plugin_of_the_wrong_kind_is_an_error() -> None:
    c = FlowControlConfig.from_dict(
        {"priorityBands": [{"priority": 1, "fairnessPolicyRef": "fcfs-ordering-policy"}]})
    with pytest.raises(FlowControlConfigError, match="is not a FairnessPolicy"):
        controller(c)


def test_refs_resolve_to_configured_plugin_instances_by_name() -> None:
    rr = RoundRobinFairness()
    limit = StaticUsageLimit(0.7)
    c = FlowControlConfig.from_dict({
        "usageLimitPolicyPluginRef": "gentle",
        "priorityBands": [{"priority": 1, "fairnessPolicyRef": "tenants"}]})
    fc = controller(c, plugins={"tenants": rr, "gentle": limit})
    assert fc.usage_limit is limit
    assert fc._bands[1].fairness is rr


def test_policy_plugins_are_registered_with_strict_parameters() -> None:
    registry = builtin_registry()
    limit = registry.create("static-usage-limit-policy", "gentle", {"threshold": 0.8})
    assert isinstance(limit, StaticUsageLimit) and limit.threshold == 0.8
    assert registry.create("static-usage-limit-policy", "", None).threshold == 1.0
    for t in ("fcfs-ordering-policy", "edf-ordering-policy", "slo-deadline-ordering-policy",
              "global-strict-fairness-policy", "round-robin-fairness-policy"):
        assert registry.create(t, "", None).type_name == t
        with pytest.raises(PluginError, match="unknown parameter"):
            registry.create(t, "", {"x": 1})
    with pytest.raises(PluginError, match="threshold"):
        registry.create("static-usage-limit-policy", "", {"thresh": 1})
    for bad in (0, -1, "1", True, float("nan")):
        with pytest.raises(PluginError, match="threshold"):
            registry.create("static-usage-limit-policy", "", {"threshold": bad})


def test_priority_usage_limit_parameters_are_strict() -> None:
    registry = builtin_registry()
    limit = registry.create("priority-usage-limit-policy", "reserve",
                            {"bands": [{"priority": -1, "threshold": 0.6}]})
    assert isinstance(limit, PriorityUsageLimit)
    assert list(limit.ceilings(0.0, [1, -1])) == [1.0, 0.6]
    for bad, match in (({"bands": [{"priority": -1, "threshold": 0}]}, "threshold"),
                       ({"bands": [{"priority": -1, "threshold": 0.5},
                                   {"priority": -1, "threshold": 0.6}]}, "listed twice"),
                       ({"bands": [{"priority": -1}]}, "threshold"),
                       ({"bands": [{"priority": "low", "threshold": 0.5}]}, "priority"),
                       ({"bands": [{"priority": 1, "threshold": 0.5, "x": 1}]}, "unknown"),
                       ({"threshold": -1}, "threshold")):
        with pytest.raises(PluginError, match=match):
            registry.create("priority-usage-limit-policy", "", bad)


def section(text: str) -> FlowControlConfig:
    """The ``flowControl`` section given as its body."""
    return FlowControlConfig.from_dict(yaml.safe_load(text))


def test_explicit_zero_ttl_turns_the_ttl_off() -> None:
    assert section("defaultRequestTTL: 0s\n").default_request_ttl == 0


def test_v010_fields_section() -> None:
    c = section("saturationDetector: {pluginRef: det}\nenableEviction: true\n"
              "noEndpointRequestTTL: 2s\n"
              "defaultNegativePriorityBand: {maxRequests: 7}\n"
              "defaultPriorityBand: {maxRequests: 9}\n")
    assert c.saturation_detector_ref == "det" and c.enable_eviction
    assert c.no_endpoint_request_ttl == 2.0
    assert c.band(-3).max_requests == 7 and c.band(-3).priority == -3
    assert c.band(0).max_requests == 9 and c.band(4).max_requests == 9


def test_negative_priorities_fall_back_to_the_default_band() -> None:
    assert section("defaultPriorityBand: {maxRequests: 9}\n").band(-1).max_requests == 9


@pytest.mark.parametrize(("text", "path"), [
    ("enableEviction: yes please\n", "flowControl.enableEviction"),
    ("saturationDetector: {pluginRef: d, extra: 1}\n", "flowControl.saturationDetector.extra"),
    ("noEndpointRequestTTL: 5\n", "flowControl.noEndpointRequestTTL"),
    ("defaultNegativePriorityBand: {priority: -1}\n",
     "flowControl.defaultNegativePriorityBand.priority"),
])
def test_bad_v010_fields_name_their_path(text: str, path: str) -> None:
    with pytest.raises(FlowControlConfigError, match=re.escape(path)):
        section(text)
