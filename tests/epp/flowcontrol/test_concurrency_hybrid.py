"""``concurrency-detector`` in ``hybrid`` mode (llm-d-router v0.10): per endpoint the fuller
of its request and token ratios, averaged over endpoints; the filter drops an endpoint full
on either dimension."""

from __future__ import annotations

from typing import Literal

import pytest

from epp.config import builtin_registry
from epp.datastore import EndpointView
from epp.requestcontrol.plugins import ConcurrencyDetector, ConcurrencyParameters
from epp.scheduling.request import LLMRequest
from shared.plugins import PluginError
from tests.support.views import build_view


def detector(mode: Literal["requests", "tokens", "hybrid"]) -> ConcurrencyDetector:
    return ConcurrencyDetector("cd", ConcurrencyParameters(
        max_concurrency=10, max_token_concurrency=1000, concurrency_mode=mode))


def loaded(i: int, requests: int, tokens: int) -> EndpointView:
    v = build_view(i)
    for _ in range(requests):
        v.start_request(tokens // max(requests, 1))
    return v


def test_hybrid_sees_endpoints_full_on_different_dimensions() -> None:
    # a: 9/10 requests, 0 tokens; b: 1/10 requests, 900/1000 tokens.
    views = [loaded(1, 9, 0), loaded(2, 1, 900)]
    assert detector("hybrid").saturation(views) == pytest.approx((0.9 + 0.9) / 2)
    # each single-dimension mode sees half of that
    assert detector("requests").saturation(views) == pytest.approx(10 / 20)
    assert detector("tokens").saturation(views) == pytest.approx(900 / 2000)


def test_hybrid_filter_drops_an_endpoint_full_on_either_dimension() -> None:
    views = [loaded(1, 10, 0), loaded(2, 1, 1000), loaded(3, 1, 100)]
    kept = detector("hybrid").filter(LLMRequest(request_id="r", target_model="m"), views)
    assert [v.key for v in kept] == [views[2].key]


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(PluginError, match="concurrencyMode"):
        builtin_registry().create("concurrency-detector", "cd",
                                  {"concurrencyMode": "bytes"}, None)
