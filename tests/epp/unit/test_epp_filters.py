"""Filters: label selector and the v0.3 decision tree."""

from __future__ import annotations

import pytest

from epp.datastore import LoraInfo
from epp.scheduling import LLMRequest
from epp.scheduling.plugins import (
    LabelSelectorFilter,
    LeastKVCacheFilter,
    LeastQueueFilter,
    LegacyDecisionTreeFilter,
    LowQueueFilter,
)
from epp.scheduling.plugins.filter.label_selector_filter import LabelSelectorParameters


def req(priority: int = 0, adapter: str | None = None) -> LLMRequest:
    return LLMRequest(request_id="r", target_model="m", priority=priority, lora_adapter=adapter)


def test_label_selector_keeps_matching_endpoints(make_view) -> None:
    a = make_view(1, labels={"role": "decode"})
    b = make_view(2, labels={"role": "prefill"})
    f = LabelSelectorFilter("f", LabelSelectorParameters(match_labels={"role": "decode"}))
    assert list(f.filter(req(), [a, b])) == [a]


def test_label_selector_expression_not_in(make_view) -> None:
    a = make_view(1, labels={"role": "decode"})
    b = make_view(2, labels={"role": "prefill"})
    params = LabelSelectorParameters(
        match_expressions=[{"key": "role", "operator": "NotIn", "values": ["prefill"]}])
    assert list(LabelSelectorFilter("f", params).filter(req(), [a, b])) == [a]


def test_label_selector_rejects_unknown_operator() -> None:
    with pytest.raises(ValueError, match="operator"):
        LabelSelectorFilter("f", LabelSelectorParameters(
            match_expressions=[{"key": "k", "operator": "Near"}]))


def test_least_queue_keeps_values_within_range_over_n(make_view) -> None:
    views = [make_view(i, waiting=q) for i, q in enumerate([0, 3, 4, 12])]
    # min 0, max 12, n 4 -> keep queue <= 3
    assert [v.queue for v in LeastQueueFilter().filter(req(), views)] == [0, 3]


def test_least_kv_keeps_values_within_range_over_n(make_view) -> None:
    views = [make_view(i, kv=k) for i, k in enumerate([0.1, 0.3, 0.5])]
    # min 0.1, max 0.5, n 3 -> keep kv <= 0.2333
    assert [v.metrics.kv_usage for v in LeastKVCacheFilter().filter(req(), views)] == [0.1]


def test_low_queue_filter_drops_queues_at_threshold(make_view) -> None:
    views = [make_view(1, waiting=127), make_view(2, waiting=128)]
    assert list(LowQueueFilter().filter(req(), views)) == [views[0]]


def test_tree_drops_sheddable_request_when_every_endpoint_is_busy(make_view) -> None:
    views = [make_view(1, waiting=6), make_view(2, kv=0.9)]
    assert list(LegacyDecisionTreeFilter().filter(req(priority=-1), views)) == []


def test_tree_sends_standard_request_to_an_endpoint_with_capacity(make_view) -> None:
    views = [make_view(1, waiting=6), make_view(2, waiting=5, kv=0.8)]
    assert list(LegacyDecisionTreeFilter().filter(req(priority=0), views)) == [views[1]]


def test_tree_never_drops_critical_requests(make_view) -> None:
    views = [make_view(1, waiting=200), make_view(2, waiting=300)]
    assert list(LegacyDecisionTreeFilter().filter(req(priority=1), views)) == [views[0]]


def test_tree_prefers_lora_affinity_for_critical_requests(make_view) -> None:
    with_adapter = make_view(1, waiting=3, lora=LoraInfo(1, frozenset({"a"})))
    without = make_view(2, waiting=0, lora=LoraInfo(1, frozenset({"b"})))
    kept = LegacyDecisionTreeFilter().filter(req(priority=1, adapter="a"), [with_adapter, without])
    assert list(kept) == [with_adapter]
