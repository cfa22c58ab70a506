"""The plugin-author harness (epp/testing.py) builds plugins as the EPP does and runs them."""

from __future__ import annotations

import pytest

from epp.testing import PluginHarness, endpoint, request
from shared.plugins import PluginError


def test_harness_scores_a_builtin_scorer_over_fake_endpoints() -> None:
    h = PluginHarness.of("queue-scorer")
    assert h.score([endpoint(1, waiting=0), endpoint(2, waiting=4)]) == [1.0, 0.0]


def test_harness_decodes_parameters_strictly() -> None:
    with pytest.raises(PluginError, match="unknown parameters"):
        PluginHarness.of("max-score-picker", {"maxEndpoints": 2})


def test_harness_commit_runs_the_pre_request_plugins_a_scorer_reads() -> None:
    h = PluginHarness.of("prefix-cache-scorer")
    pool = [endpoint(1), endpoint(2)]
    h.commit(pool[1], request("a long shared system prompt " * 10))
    assert h.score(pool, request("a long shared system prompt " * 10)) == [0.0, 1.0]
