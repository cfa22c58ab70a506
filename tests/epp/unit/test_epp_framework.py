"""The scheduling framework: profiles, weights, clamping, filters, errors, hooks."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from epp.datastore import EndpointView
from epp.scheduling import (
    Filter,
    LLMRequest,
    NoCandidates,
    NoEndpointPicked,
    Scheduler,
    SchedulerHooks,
    SchedulingProfile,
    Scorer,
    WeightedScorer,
)
from epp.scheduling.plugins import MaxScorePicker, SingleProfileHandler

REQ = LLMRequest(request_id="r", target_model="m")


class FixedScorer(Scorer):
    """Returns given scores by endpoint index (a test plugin, not a mock of ours)."""

    type_name = "fixed"

    def __init__(self, scores: list[float]) -> None:
        super().__init__("fixed")
        self.scores = scores

    def score(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        return self.scores[: len(endpoints)]


class DropAll(Filter):
    type_name = "drop-all"

    def filter(
        self, request: LLMRequest, endpoints: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        return []


def scheduler(*scorers: tuple[Scorer, float], filters: Sequence[Filter] = (),
              hooks: SchedulerHooks | None = None) -> Scheduler:
    profile = SchedulingProfile("default", MaxScorePicker(), list(filters),
                                [WeightedScorer(s, w) for s, w in scorers])
    return Scheduler([profile], SingleProfileHandler(), rng=random.Random(0), hooks=hooks)


def test_weights_decide_between_disagreeing_scorers(make_view) -> None:
    views = [make_view(0), make_view(1)]
    s = scheduler((FixedScorer([1.0, 0.0]), 1.0), (FixedScorer([0.0, 1.0]), 3.0))
    assert s.schedule(REQ, views).endpoints == [views[1]]


def test_total_is_weighted_sum(make_view) -> None:
    views = [make_view(0), make_view(1)]
    s = scheduler((FixedScorer([0.5, 0.25]), 2.0), (FixedScorer([1.0, 0.0]), 1.0))
    assert s.schedule(REQ, views).primary.scores() == {views[0].key: 2.0, views[1].key: 0.5}


def test_out_of_range_scores_are_clamped(make_view) -> None:
    views = [make_view(0), make_view(1), make_view(2)]
    s = scheduler((FixedScorer([7.0, -3.0, float("nan")]), 1.0))
    assert list(s.schedule(REQ, views).primary.totals) == [1.0, 0.0, 0.0]


def test_filter_emptying_the_set_is_a_429(make_view) -> None:
    s = scheduler(filters=[DropAll()])
    with pytest.raises(NoEndpointPicked, match="drop-all") as info:
        s.schedule(REQ, [make_view(0)])
    assert info.value.status == 429


def test_no_candidates_is_a_503() -> None:
    with pytest.raises(NoCandidates) as info:
        scheduler().schedule(REQ, [])
    assert info.value.status == 503


def test_destination_lists_picked_endpoints(make_view) -> None:
    views = [make_view(3)]
    assert scheduler().schedule(REQ, views).destination == "10.0.0.3:8000"


def test_hooks_receive_plugin_and_e2e_durations(make_view) -> None:
    seen: list[str] = []
    hooks = SchedulerHooks(
        e2e_duration=lambda s: seen.append("e2e"),
        plugin_duration=lambda point, ptype, name, s: seen.append(f"{point}:{ptype}"),
    )
    scheduler((FixedScorer([1.0]), 1.0), hooks=hooks).schedule(REQ, [make_view(0)])
    assert seen == ["scorer:fixed", "picker:max-score-picker", "e2e"]


def test_single_profile_handler_refuses_two_profiles() -> None:
    profiles = [SchedulingProfile("a", MaxScorePicker()), SchedulingProfile("b", MaxScorePicker())]
    with pytest.raises(ValueError, match="exactly one"):
        Scheduler(profiles, SingleProfileHandler())
