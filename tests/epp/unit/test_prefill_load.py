"""Pending prefill (``inflight-load-producer``) and ``prefill-load-scorer``: the uncached
prompt tokens routed to an endpoint count from the pick until the first token comes back."""

from __future__ import annotations

import random

import pytest

from epp.config import build, parse_config
from epp.requestcontrol import Director
from epp.scheduling.plugins.scorer.prefill_load_scorer import PrefillLoadScorer
from tests.epp.unit.test_director import HEADERS, body, director, store


def test_pending_prefill_counts_from_the_pick_to_the_first_token() -> None:
    d = director()
    _, routed = d.route(HEADERS, body("x" * 400), {})
    view, tokens = routed.endpoint, routed.request.prompt_tokens
    assert tokens > 0 and view.prefill_tokens == tokens
    d.response_received(routed, 200, {"content-type": "text/event-stream"})
    d.response_chunk(routed, b": keep-alive\n\n", False)  # no token yet
    assert view.prefill_tokens == tokens
    d.response_chunk(routed, b'data: {"choices":[{"text":"a"}]}\n\n', True)
    # the prompt is computed; the request is still in flight (decoding)
    assert (view.prefill_tokens, view.inflight_tokens) == (0, tokens)
    d.response_chunk(routed, b'data: {"choices":[{"text":"b"}]}\n\n', True)
    d.finish(routed, completed=True, status=200, response_size=10, prompt_tokens=tokens,
             completion_tokens=2)
    assert (view.prefill_tokens, view.inflight_tokens) == (0, 0)


@pytest.mark.parametrize("completed", [True, False])
def test_a_response_without_a_streamed_token_releases_its_prefill_at_the_end(
        completed: bool) -> None:
    d = director()
    _, routed = d.route(HEADERS, body("x" * 400), {})
    d.response_received(routed, 200, {"content-type": "application/json"})
    assert routed.endpoint.prefill_tokens > 0  # not streamed: no first token to wait for
    d.finish(routed, completed=completed, status=200, response_size=10, prompt_tokens=100,
             completion_tokens=1)
    assert [v.prefill_tokens for v in d.datastore.views()] == [0, 0, 0]


def test_only_the_tokens_the_endpoint_does_not_hold_are_pending() -> None:
    d = Director.of(build(parse_config(None), store(), rng=random.Random(0)))
    prompt = "the same long system prompt " * 40
    _, first = d.route(HEADERS, body(prompt), {})
    tokens = first.request.prompt_tokens
    assert first.endpoint.prefill_tokens == tokens  # nothing cached yet
    d.response_chunk(first, b'data: {"choices":[{"text":"a"}]}\n\n', True)
    _, second = d.route(HEADERS, body(prompt), {})
    assert second.endpoint is first.endpoint
    # every full block of the prompt is cached there now: only the tail is left to compute
    assert 0 <= second.endpoint.prefill_tokens < tokens / 4


def scorer_runtime() -> Director:
    text = """\
plugins:
- type: prefix-cache-scorer
- type: prefill-load-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefill-load-scorer, weight: 1}
"""
    return Director.of(build(parse_config(text), store(), rng=random.Random(0)))


def test_scorer_is_the_ratio_of_the_least_work_to_each_endpoints_work() -> None:
    d = scorer_runtime()
    (scorer,) = d.runtime.handle.find(PrefillLoadScorer)
    views = d.datastore.views()
    pending = [0, 300, 100]
    for view, p in zip(views, pending, strict=True):
        view.prefill_tokens = p
    pick = d.prepare(HEADERS, body("y" * 400), {})
    own = pick.request.prompt_tokens  # nothing cached anywhere: the whole prompt
    scores = scorer.score(pick.request, views)
    least = own + 1
    assert scores == pytest.approx([least / (p + own + 1) for p in pending])
    assert scores[0] == 1.0


def test_scorer_counts_a_cached_prefix_as_work_already_done() -> None:
    d = scorer_runtime()
    (scorer,) = d.runtime.handle.find(PrefillLoadScorer)
    prompt = "a shared prefix that fills several blocks " * 30
    _, first = d.route(HEADERS, body(prompt), {})
    d.response_chunk(first, b'data: {"choices":[{"text":"a"}]}\n\n', True)
    again = d.prepare(HEADERS, body(prompt), {})
    views = d.datastore.views()
    scores = scorer.score(again.request, views)
    warm = views.index(first.endpoint)
    assert scores[warm] == 1.0
    assert all(s < 0.5 for i, s in enumerate(scores) if i != warm)
