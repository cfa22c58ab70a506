"""``bench.slo_features``: its offline replay of the online model is the producer's, so the
candidate inputs it adds are judged against the figure the twin measures."""

from __future__ import annotations

import pytest

from bench import slo_features, slo_twin


@pytest.fixture(scope="module")
def picks() -> list[slo_features.Pick]:
    return slo_features.record(1, 40.0)


def test_the_replay_without_candidates_reproduces_the_twins_tpot_mape(
        picks: list[slo_features.Pick]) -> None:
    replayed = slo_features.online_mape(picks, lambda p: ())
    assert replayed == pytest.approx(slo_twin.prediction_error("sharegpt", 1, 40.0)[1])
    # A candidate input changes the fit (the replay really refits with it).
    with_rate = slo_features.online_mape(picks, slo_features.CANDIDATES[
        "+ uncached tokens sent there, last 5 s"])
    assert with_rate != pytest.approx(replayed)


def test_the_later_prefill_rate_is_measured_and_explained_only_in_part(
        picks: list[slo_features.Pick]) -> None:
    assert all(p.extra["later_rate"] >= 0 for p in picks)
    assert any(p.extra["later_rate"] > 0 for p in picks)
    r2 = slo_features.r_squared(picks, lambda p: p.relative)
    assert 0 <= r2 < 1
