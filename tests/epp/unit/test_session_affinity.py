"""``session-affinity-scorer``: tokens name the endpoint that served, only the EPP's key can
make them, and they only ever prefer a current, unsaturated candidate."""

from __future__ import annotations

import random

from epp.config import build, parse_config
from epp.handle import Settings
from epp.requestcontrol import Director
from epp.requestcontrol.plugin import Response
from epp.scheduling import LLMRequest
from epp.scheduling.plugins.scorer.session_affinity_scorer import (
    SESSION_HEADER,
    SessionAffinityScorer,
)
from tests.epp.unit.test_director import HEADERS, KEYS, body, store
from tests.support.views import ViewFactory

CONFIG = """\
plugins:
- type: session-affinity-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: session-affinity-scorer, weight: 10}
  - {pluginRef: queue-scorer, weight: 1}
"""


def request(token: str | None) -> LLMRequest:
    headers = {} if token is None else {SESSION_HEADER: token}
    return LLMRequest(request_id="r", target_model="m", client_model="m", prompt="",
                      headers=headers)


def served_token(scorer: SessionAffinityScorer, view: object) -> str:
    response = Response("r")
    scorer.response_received(request(None), response, view)  # type: ignore[arg-type]
    return response.set_headers[SESSION_HEADER]


def test_the_response_carries_a_token_that_prefers_the_endpoint_that_served(
        make_view: ViewFactory) -> None:
    scorer = SessionAffinityScorer()
    views = [make_view(i) for i in range(3)]
    token = served_token(scorer, views[1])
    assert scorer.score(request(token), views) == [0.0, 1.0, 0.0]


def test_the_token_is_opaque(make_view: ViewFactory) -> None:
    view = make_view(7)
    token = served_token(SessionAffinityScorer(), view)
    assert "10.0.0.7" not in token and "pod-7" not in token and len(token) == 32


def test_no_token_prefers_nothing(make_view: ViewFactory) -> None:
    assert SessionAffinityScorer().score(request(None), [make_view(0), make_view(1)]) == [0, 0]


def test_a_forged_token_prefers_nothing(make_view: ViewFactory) -> None:
    scorer = SessionAffinityScorer(key=b"k" * 32)
    views = [make_view(i) for i in range(3)]
    real = served_token(scorer, views[0])
    forged = [real[:-1] + ("A" if real[-1] != "A" else "B"), "x" * 32, "",
              "MTAuMC4wLjE6ODAwMA==", "default/pod-0-rank-0"]
    for token in forged:
        assert scorer.score(request(token), views) == [0.0, 0.0, 0.0], token


def test_a_token_made_with_another_key_prefers_nothing(make_view: ViewFactory) -> None:
    views = [make_view(i) for i in range(3)]
    token = served_token(SessionAffinityScorer(key=b"a" * 32), views[2])
    assert SessionAffinityScorer(key=b"b" * 32).score(request(token), views) == [0, 0, 0]


def test_a_stale_token_for_an_endpoint_that_left_prefers_nothing(
        make_view: ViewFactory) -> None:
    scorer = SessionAffinityScorer()
    gone = make_view(9)
    token = served_token(scorer, gone)
    scorer.retain_endpoints(frozenset())
    assert scorer.score(request(token), [make_view(0), make_view(1)]) == [0.0, 0.0]


def test_a_saturated_endpoint_loses_its_affinity(make_view: ViewFactory) -> None:
    scorer = SessionAffinityScorer()
    for busy in (make_view(1, waiting=5), make_view(1, kv=0.85)):
        token = served_token(scorer, busy)
        assert scorer.score(request(token), [make_view(0), busy]) == [0.0, 0.0]


def test_the_key_comes_from_the_handle_settings() -> None:
    runtime = build(parse_config(CONFIG), store(),
                    settings=Settings(session_token_key=b"s" * 32), rng=random.Random(0))
    (scorer,) = runtime.handle.find(SessionAffinityScorer)
    other = SessionAffinityScorer(key=b"s" * 32)
    view = runtime.datastore.candidates()[0]
    assert scorer.token(view) == other.token(view)


def test_through_the_director_the_next_turn_goes_back_to_the_same_endpoint() -> None:
    d = Director.of(build(parse_config(CONFIG), store(), rng=random.Random(0)))
    _, first = d.route(HEADERS, body(), {})
    token = d.response_received(first, 200, {})[SESSION_HEADER]
    _, other = d.route(HEADERS, body(), {})  # without the token: queue-scorer moves on
    assert other.endpoint.key != first.endpoint.key
    for _ in range(3):  # with it: back to the first endpoint, though it is now the busiest
        _, routed = d.route({**HEADERS, SESSION_HEADER: token}, body(), {})
        assert routed.endpoint.key == first.endpoint.key


def test_through_the_director_a_saturated_session_endpoint_is_left() -> None:
    d = Director.of(build(parse_config(CONFIG), store(), rng=random.Random(0)))
    _, first = d.route(HEADERS, body(), {})
    token = d.response_received(first, 200, {})[SESSION_HEADER]
    keys = {first.endpoint.key}
    for _ in range(8):  # in-flight requests fill its queue past the threshold (5)
        _, routed = d.route({**HEADERS, SESSION_HEADER: token}, body(), {})
        keys.add(routed.endpoint.key)
    assert len(keys) > 1 and keys <= set(KEYS)
