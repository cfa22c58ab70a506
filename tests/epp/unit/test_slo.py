"""SLO-aware scheduling: the SLO headers, the online latency model, and the plugins that
use its predictions (upstream v1.5's predicted-latency set). Real plugins over real endpoint
views and a real director; predictions come from a really fitted model or are written the
way the producer writes them."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

import pytest
from prometheus_client import REGISTRY

from epp.config import ConfigError, build, parse_config
from epp.latency import parse_slo
from epp.latency.predictions import PREDICTIONS_KEY, Prediction, RequestPredictions
from epp.latency.predictor import (
    EndpointState,
    LatencyPredictor,
    Linear,
    PredictorConfig,
    fit_linear,
)
from epp.latency.slo import SLO, InvalidSLO
from epp.requestcontrol import Director
from epp.requestcontrol.plugins.latency_slo_admitter import LatencySloAdmitter, SloUnattainable
from epp.requestcontrol.plugins.predicted_latency_producer import PredictedLatencyProducer
from epp.scheduling import LLMRequest
from epp.scheduling.plugins.filter.prefix_cache_affinity_filter import (
    AffinityFilterParameters,
    PrefixCacheAffinityFilter,
)
from epp.scheduling.plugins.filter.slo_headroom_tier_filter import (
    SloHeadroomTierFilter,
    TierFilterParameters,
)
from epp.scheduling.plugins.scorer.latency_scorer import LatencyScorer, LatencyScorerParameters
from tests.epp.unit.test_director import HEADERS, body, store
from tests.support.views import build_view

LATENCY_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- name: strict-affinity-filter
  type: prefix-cache-affinity-filter
  parameters: {affinityThreshold: 0.99}
- name: loose-affinity-filter
  type: prefix-cache-affinity-filter
  parameters: {affinityThreshold: 0.80}
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
"""


def state(uncached: float = 100, waiting: float = 0, running: float = 0,
          kv: float = 0.1) -> EndpointState:
    return EndpointState(200.0, uncached, waiting, running, kv, 0.0)


def true_ttft(s: EndpointState) -> float:
    return (0.02 + 0.0005 * s.uncached_tokens + 0.05 * s.waiting
            + 0.00002 * s.uncached_tokens * s.running)


def true_tpot(s: EndpointState) -> float:
    return 0.01 + 0.002 * s.running + 0.001 * s.waiting


def trained(n: int = 300, seed: int = 0) -> LatencyPredictor:
    rng = random.Random(seed)
    p = LatencyPredictor(PredictorConfig(min_samples=20))
    for _ in range(n):
        s = state(rng.uniform(0, 2000), rng.randint(0, 8), rng.randint(0, 16), rng.random())
        p.observe(s, true_ttft(s), true_tpot(s))
    assert p.retrain()
    return p


# -- headers --------------------------------------------------------------------------------


def test_slo_headers_are_read_in_milliseconds() -> None:
    assert parse_slo({"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20.5"}) == SLO(0.25, 0.0205)
    assert parse_slo({"x-slo-ttft-ms": "100"}) == SLO(0.1, None)
    assert not parse_slo({}).any


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf", "", "1e400"])
def test_a_bad_slo_header_is_a_400(value: str) -> None:
    with pytest.raises(InvalidSLO) as err:
        parse_slo({"x-slo-tpot-ms": value})
    assert err.value.status == 400
    assert err.value.to_json()["error"]["code"] == "invalid_slo_header"
    assert "x-slo-tpot-ms" in err.value.to_json()["error"]["message"]


def test_through_the_director_a_bad_slo_header_is_refused_before_scheduling() -> None:
    d = Director.of(build(parse_config(LATENCY_CONFIG), store(), rng=random.Random(0)))
    with pytest.raises(InvalidSLO):
        d.route({**HEADERS, "x-slo-ttft-ms": "soon"}, body(), {})
    assert all(v.inflight_requests == 0 for v in d.datastore.views())


# -- the model ------------------------------------------------------------------------------


def test_the_model_predicts_nothing_before_it_has_enough_samples() -> None:
    p = LatencyPredictor(PredictorConfig(min_samples=20))
    for _ in range(19):
        p.observe(state(), 0.1, 0.01)
    assert not p.retrain()
    assert p.predict(state()) == (None, None)


def test_the_fitted_model_learns_ttft_and_tpot_from_completed_requests() -> None:
    p = trained()
    for s in (state(100, 0, 2), state(1500, 4, 10), state(800, 1, 0, 0.5)):
        ttft, tpot = p.predict(s)
        assert ttft == pytest.approx(true_ttft(s), rel=0.05)
        assert tpot == pytest.approx(true_tpot(s), rel=0.05)


def test_a_fitted_linear_model_is_served_as_a_dot_product() -> None:
    model = fit_linear([[0.0], [1.0], [2.0], [3.0]], [1.0, 3.0, 5.0, 7.0])
    assert model([2.5]) == pytest.approx(6.0, rel=0.01)
    assert Linear(-5.0, (1.0,))([0.0]) > 0  # never below the floor


def test_a_prediction_stays_within_the_latencies_the_model_was_fitted_on() -> None:
    model = fit_linear([[0.0], [1.0], [2.0], [3.0]], [1.0, 3.0, 5.0, 7.0])
    assert model([10.0]) == pytest.approx(7.0)
    assert model([-10.0]) == pytest.approx(1.0)
    assert model.many(__import__("numpy").array([[10.0], [-10.0], [2.5]])) == \
        pytest.approx([7.0, 1.0, 6.0], rel=0.01)


def test_a_pick_is_never_blocked_by_retraining() -> None:
    """The fit is held open (waiting for the picks) while requests are routed: if a pick
    waited for training, this would deadlock (and time out) instead of passing."""
    in_fit, picks_done = threading.Event(), threading.Event()

    def held_fit(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> Linear:
        in_fit.set()
        assert picks_done.wait(30), "picks never finished while training was running"
        return fit_linear(xs, ys)

    runtime = build(parse_config(LATENCY_CONFIG), store(), rng=random.Random(0))
    (producer,) = runtime.handle.find(PredictedLatencyProducer)
    producer.predictor = predictor = trained()
    before = predictor.ttft_model
    predictor._fit = held_fit
    predictor.observe(state(), 0.2, 0.02)
    trainer = threading.Thread(target=predictor.retrain)
    trainer.start()
    assert in_fit.wait(30)
    d = Director.of(runtime)
    for _ in range(50):
        _, routed = d.route({**HEADERS, "x-slo-ttft-ms": "500"}, body(), {})
        preds = routed.request.plugin_state[PREDICTIONS_KEY]
        assert preds.predicted  # served by the previous model during the retrain
        d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=1,
                 completion_tokens=1)
    assert predictor.ttft_model is before
    picks_done.set()
    trainer.join(30)
    assert predictor.ttft_model is not before


def test_the_producer_retrains_in_the_background_from_what_requests_measured() -> None:
    runtime = build(parse_config(LATENCY_CONFIG.replace(
        "{streamingMode: true}", "{streamingMode: true, minTrainingSamples: 5, "
        "retrainInterval: 10ms}")), store(), rng=random.Random(0))
    (producer,) = runtime.handle.find(PredictedLatencyProducer)
    d = Director.of(runtime)
    for _ in range(6):
        _, routed = d.route(HEADERS, body(), {})
        d.response_received(routed, 200, {"content-type": "text/event-stream"})
        d.response_chunk(routed, b"data: {}\n\n", True)
        d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=5,
                 completion_tokens=4)
    assert producer.predictor.samples == 6
    # The daemon thread picks the samples up on its schedule and fits them in the spawned
    # worker process (which imports scikit-learn first: slow on a loaded machine).
    done = threading.Event()
    for _ in range(12_000):
        if producer.predictor.retrains >= 1:  # counted once both models are in place
            break
        done.wait(0.01)
    assert producer.predictor.retrains >= 1
    assert producer.predictor.ttft_model is not None
    assert producer.predictor.tpot_model is not None


# -- plugins --------------------------------------------------------------------------------


def request_with(preds: dict[str, Prediction], slo: SLO, priority: int = 0,
                 prefix: dict[str, float] | None = None) -> LLMRequest:
    r = LLMRequest(request_id="r", target_model="m", client_model="m", prompt=b"p" * 640,
                   priority=priority)
    r.plugin_state[PREDICTIONS_KEY] = RequestPredictions(slo, True, preds, prefix or {})
    return r


def pred(ttft_h: float, tpot_h: float = 0.0, dispatched: int = 1, ttft: float = 0.1,
         ) -> Prediction:
    return Prediction(ttft, 0.01, ttft_h, tpot_h, 0.0, dispatched, 0.5, 0)


def views(n: int) -> list:
    return [build_view(i) for i in range(n)]


def test_the_tier_filter_keeps_the_endpoints_predicted_to_meet_the_slo() -> None:
    vs = views(3)
    r = request_with({vs[0].key: pred(-0.1), vs[1].key: pred(0.05), vs[2].key: pred(0.2)},
                     SLO(0.3))
    keep = SloHeadroomTierFilter(params=TierFilterParameters(0.0)).filter(r, vs)
    assert [v.key for v in keep] == [vs[1].key, vs[2].key]
    explore = SloHeadroomTierFilter(params=TierFilterParameters(1.0)).filter(r, vs)
    assert [v.key for v in explore] == [vs[0].key]


def test_the_tier_filter_lets_requests_without_an_slo_through_untouched() -> None:
    vs = views(3)
    r = request_with({v.key: pred(-0.1 * i) for i, v in enumerate(vs)}, SLO())
    assert list(SloHeadroomTierFilter(params=TierFilterParameters(0.0)).filter(r, vs)) == vs


def test_the_latency_scorer_scores_only_endpoints_that_meet_the_slo() -> None:
    vs = views(3)
    r = request_with({vs[0].key: pred(-0.1), vs[1].key: pred(0.05), vs[2].key: pred(0.2)},
                     SLO(0.3))
    least = LatencyScorer().score(r, vs)
    assert least[0] == 0 and least[1] > least[2]  # closest to the SLO first (bin-packing)
    most = LatencyScorer(params=LatencyScorerParameters(
        headroom_selection_strategy="most")).score(r, vs)
    assert most[0] == 0 and most[2] > most[1]


def test_without_an_slo_the_latency_scorer_prefers_the_lowest_predicted_latency() -> None:
    vs = views(3)
    r = request_with({vs[0].key: pred(-0.3, -0.02), vs[1].key: pred(-0.1, -0.03),
                      vs[2].key: pred(-0.2, -0.01)}, SLO())
    s = LatencyScorer().score(r, vs)
    assert s.index(max(s)) == 1


def test_when_no_endpoint_meets_the_slo_idle_endpoints_are_preferred() -> None:
    vs = views(3)
    r = request_with({vs[0].key: pred(-0.1), vs[1].key: pred(-0.5, dispatched=0),
                      vs[2].key: pred(-0.05)}, SLO(0.1))
    s = LatencyScorer().score(r, vs)
    assert s[1] > 0 and s[0] == s[2] == 0


def test_without_predictions_the_latency_scorer_falls_back_to_load_and_prefix() -> None:
    vs = [build_view(0, kv=0.9, waiting=4), build_view(1, kv=0.1, waiting=0)]
    r = LLMRequest(request_id="r", target_model="m", client_model="m", prompt=b"")
    s = LatencyScorer().score(r, vs)
    assert s[1] > s[0]


def test_the_admitter_sheds_a_sheddable_request_no_endpoint_can_serve_in_time() -> None:
    vs = [build_view(i, kv=0.5) for i in range(2)]
    for v in vs:
        v.start_request(10)
    preds = {v.key: pred(-0.2) for v in vs}
    with pytest.raises(SloUnattainable) as err:
        LatencySloAdmitter().admit(request_with(preds, SLO(0.1), priority=-1), vs)
    assert err.value.status == 429
    LatencySloAdmitter().admit(request_with(preds, SLO(0.1), priority=0), vs)  # not sheddable
    LatencySloAdmitter().admit(request_with(preds, SLO(), priority=-1), vs)  # no SLO
    preds[vs[1].key] = pred(0.05)
    LatencySloAdmitter().admit(request_with(preds, SLO(0.1), priority=-1), vs)  # one meets it


def test_the_admitter_admits_when_an_endpoint_is_idle_or_cold() -> None:
    idle, cold = build_view(0, kv=0.5), build_view(1, kv=0.01)
    cold.start_request(1)
    for vs in ([idle], [cold]):
        preds = {v.key: pred(-0.2) for v in vs}
        LatencySloAdmitter().admit(request_with(preds, SLO(0.1), priority=-1), vs)


def test_the_affinity_filter_keeps_endpoints_holding_the_prompt() -> None:
    f = PrefixCacheAffinityFilter("f", AffinityFilterParameters(exploration_probability=0))
    vs = views(3)
    r = LLMRequest(request_id="r", target_model="m", client_model="m", prompt=b"x" * 640)
    assert list(f.filter(r, vs)) == vs  # nothing cached anywhere: all kept
    f.producer.record(r, vs[2])
    r2 = LLMRequest(request_id="r2", target_model="m", client_model="m", prompt=b"x" * 640)
    assert [v.key for v in f.filter(r2, vs)] == [vs[2].key]


def test_the_affinity_filter_breaks_stickiness_when_it_costs_too_much_ttft() -> None:
    f = PrefixCacheAffinityFilter("f", AffinityFilterParameters(
        exploration_probability=0, max_ttft_penalty_ms=100, ttft_source="latencyPredictor"))
    vs = views(2)
    r = LLMRequest(request_id="r", target_model="m", client_model="m", prompt=b"x" * 640)
    f.producer.record(r, vs[0])
    r2 = request_with({vs[0].key: pred(0, ttft=0.5), vs[1].key: pred(0, ttft=0.1)}, SLO())
    r2.prompt = b"x" * 640
    assert list(f.filter(r2, vs)) == vs
    r3 = request_with({vs[0].key: pred(0, ttft=0.15), vs[1].key: pred(0, ttft=0.1)}, SLO())
    r3.prompt = b"x" * 640
    assert [v.key for v in f.filter(r3, vs)] == [vs[0].key]


# -- end to end in process -------------------------------------------------------------------


def test_upstreams_latency_config_routes_and_records_predictions_and_violations() -> None:
    runtime = build(parse_config(LATENCY_CONFIG), store(), rng=random.Random(0))
    (producer,) = runtime.handle.find(PredictedLatencyProducer)
    producer.predictor = trained()
    d = Director.of(runtime)
    labels = {"model_name": "m", "target_model_name": "m"}

    def value(name: str, **extra: str) -> float:
        return REGISTRY.get_sample_value(name, {**labels, **extra}) or 0.0

    before = (value("inference_objective_request_predicted_ttft_seconds_count"),
              value("inference_objective_request_slo_violation_total", type="ttft"))
    _, routed = d.route({**HEADERS, "x-slo-ttft-ms": "0.001"}, body(), {})
    d.response_received(routed, 200, {"content-type": "text/event-stream"})
    d.response_chunk(routed, b"data: {}\n\n", True)
    d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=5,
             completion_tokens=3)
    assert value("inference_objective_request_predicted_ttft_seconds_count") == before[0] + 1
    assert value("inference_objective_request_slo_violation_total", type="ttft") == \
        before[1] + 1


def test_requests_without_an_slo_are_not_shed_by_the_admitter() -> None:
    runtime = build(parse_config(LATENCY_CONFIG), store(), rng=random.Random(0))
    (producer,) = runtime.handle.find(PredictedLatencyProducer)
    producer.predictor = trained()
    d = Director.of(runtime)
    for v in d.datastore.views():
        v.start_request(100)
    _, routed = d.route({**HEADERS, "x-gateway-inference-objective": "none"}, body(), {})
    assert routed.endpoint is not None


def test_a_bad_producer_parameter_names_the_field() -> None:
    with pytest.raises(ConfigError, match="sloBufferFactor"):
        build(parse_config(LATENCY_CONFIG.replace("{streamingMode: true}",
                                                  "{sloBufferFactor: 0}")), store())
    with pytest.raises(ConfigError, match="samplingMeen"):
        build(parse_config(LATENCY_CONFIG.replace("{streamingMode: true}",
                                                  "{samplingMeen: 3}")), store())


def test_prompt_tokens_count_as_in_prefill_until_the_first_token() -> None:
    d = Director.of(build(parse_config(LATENCY_CONFIG), store(), rng=random.Random(0)))
    _, first = d.route(HEADERS, body(), {})
    key, tokens = first.endpoint.key, first.request.prompt_tokens
    assert first.request.plugin_state[PREDICTIONS_KEY].prefill_charge == tokens  # all uncached
    _, second = d.route(HEADERS, body(), {})
    assert second.request.plugin_state[PREDICTIONS_KEY].states[key][7] == tokens
    d.response_received(first, 200, {"content-type": "text/event-stream"})
    d.response_chunk(first, b"data: {}\n\n", True)
    _, third = d.route(HEADERS, body(), {})
    charge = second.request.plugin_state[PREDICTIONS_KEY].prefill_charge
    expected = charge if second.endpoint.key == key else 0
    assert third.request.plugin_state[PREDICTIONS_KEY].states[key][7] == expected
    for routed in (second, third):
        d.finish(routed, completed=False, status=200, response_size=0, prompt_tokens=0,
                 completion_tokens=0)
    _, fourth = d.route(HEADERS, body(), {})
    assert fourth.request.plugin_state[PREDICTIONS_KEY].states[key][7] == 0


def test_uncached_tokens_come_from_the_matched_blocks_not_the_prefix_score() -> None:
    """The prefix index hashes at most 256 blocks (64 bytes ~ 16 tokens each): a prompt whose
    hashed head is all cached scores 1.0, yet its tail still has to be prefilled, and that
    tail is also what the request adds to the endpoint's prefill count."""
    d = Director.of(build(parse_config(LATENCY_CONFIG), store(), rng=random.Random(0)))
    head = "system prompt. " * (64 * 300 // 15)
    _, first = d.route(HEADERS, body(head + "first question"), {})
    key = first.endpoint.key
    _, second = d.route(HEADERS, body(head + "a much longer second question " * 40), {})
    preds = second.request.plugin_state[PREDICTIONS_KEY]
    assert preds.prefix_scores[key] == 1.0
    tail = second.request.prompt_tokens - 256 * 16
    assert preds.states[key][1] == tail > 0
    assert second.endpoint.key == key  # the strict affinity filter keeps the cached endpoint
    assert preds.prefill_charge == tail
    _, third = d.route(HEADERS, body("unrelated"), {})
    first_charge = first.request.plugin_state[PREDICTIONS_KEY].prefill_charge
    assert third.request.plugin_state[PREDICTIONS_KEY].states[key][7] == first_charge + tail


def test_predicting_many_rows_at_once_equals_predicting_each() -> None:
    p = trained()
    states = [state(100, 0, 2), state(1500, 4, 10), state(800, 1, 0, 0.5)]
    ttfts, tpots = p.predict_rows([s.row() for s in states])
    assert ttfts is not None and tpots is not None
    for s, ttft, tpot in zip(states, ttfts, tpots, strict=True):
        assert (ttft, tpot) == pytest.approx(p.predict(s))
        assert EndpointState.from_row(s.row()) == s


def test_requests_count_as_in_prefill_until_the_first_token() -> None:
    """The model's ``prefill_requests`` input: requests sent to the endpoint with no first
    token back yet (beside their tokens, ``prefill_tokens``)."""
    d = Director.of(build(parse_config(LATENCY_CONFIG), store(), rng=random.Random(0)))
    _, first = d.route(HEADERS, body(), {})
    key = first.endpoint.key
    assert first.request.plugin_state[PREDICTIONS_KEY].states[key][8] == 0
    _, second = d.route(HEADERS, body(), {})
    assert second.request.plugin_state[PREDICTIONS_KEY].states[key][8] == 1
    d.response_received(first, 200, {"content-type": "text/event-stream"})
    d.response_chunk(first, b"data: {}\n\n", True)
    _, third = d.route(HEADERS, body(), {})
    expected = 1 if second.endpoint.key == key else 0
    assert third.request.plugin_state[PREDICTIONS_KEY].states[key][8] == expected
    for routed in (first, second, third):
        d.finish(routed, completed=False, status=200, response_size=0, prompt_tokens=0,
                 completion_tokens=0)
    _, fourth = d.route(HEADERS, body(), {})
    assert fourth.request.plugin_state[PREDICTIONS_KEY].states[key][8] == 0


def test_the_model_tells_many_short_prefills_from_a_few_long_ones() -> None:
    """Equal prefill tokens in flight, split over 1 or 8 requests: each request in prefill
    costs the engine a step's overhead, and the model learns it from ``prefill_requests``."""
    def ttft_of(s: EndpointState) -> float:
        return 0.02 + 0.0005 * s.uncached_tokens + 0.0002 * s.prefill_tokens \
            + 0.04 * s.prefill_requests

    rng = random.Random(3)
    p = LatencyPredictor(PredictorConfig(min_samples=20))
    for _ in range(300):
        s = EndpointState(200.0, rng.uniform(0, 2000), 0, rng.randint(0, 8), 0.1, 0.0,
                          rng.uniform(0, 8000), rng.randint(0, 8))
        p.observe(s, ttft_of(s), 0.01)
    assert p.retrain()
    one, many = (EndpointState(200.0, 500, 0, 4, 0.1, 0.0, 4000, n) for n in (1, 8))
    for s in (one, many):
        assert p.predict(s)[0] == pytest.approx(ttft_of(s), rel=0.02)


def test_the_fit_minimises_relative_error_so_a_slow_minority_does_not_drag_it() -> None:
    """The fit is a median regression weighted 1/y (it minimises MAPE): 30% of the samples
    three times slower than the rest (a transient) leave the prediction on the majority; a
    least-squares fit, even weighted 1/y², would move ~10% towards them."""
    xs = [[float(i % 10)] for i in range(100)]
    ys = [(3.0 if i // 10 in (1, 4, 7) else 1.0) * (1.0 + x[0])
          for i, x in enumerate(xs)]
    model = fit_linear(xs, ys)
    for x in (0.0, 5.0, 9.0):
        assert model([x]) == pytest.approx(1.0 + x, rel=0.02)


# -- in-stream TPOT predictions (maxDecodeTokenSamplesForPrediction) ------------------------


def sampled_director(params: str) -> tuple[Director, PredictedLatencyProducer]:
    config = LATENCY_CONFIG.replace("{streamingMode: true}", params)
    runtime = build(parse_config(config), store(), rng=random.Random(0))
    (producer,) = runtime.handle.find(PredictedLatencyProducer)
    producer.predictor = trained()
    return Director.of(runtime), producer


def stream(d: Director, chunks: int) -> tuple[object, RequestPredictions]:
    _, routed = d.route(HEADERS, body(), {})
    d.response_received(routed, 200, {"content-type": "text/event-stream"})
    for _ in range(chunks):
        d.response_chunk(routed, b"data: {}\n\n", True)
    preds = routed.request.plugin_state[PREDICTIONS_KEY]
    assert isinstance(preds, RequestPredictions)
    return routed, preds


def test_sampled_tokens_predict_tpot_again_from_the_endpoints_state_then() -> None:
    d, producer = sampled_director(
        "{streamingMode: true, maxDecodeTokenSamplesForPrediction: 3, samplingMean: 2}")
    routed, preds = stream(d, 1)  # the first token: no in-stream prediction yet
    assert len(preds.tpot_predictions) == 1  # the pick's
    from epp.datastore import EndpointMetrics

    # The endpoint fills up while the request decodes; the next samples see it.
    d.datastore.record_scrape(routed.endpoint, EndpointMetrics(waiting=6, running=14,
                                                               kv_usage=0.9))
    for _ in range(200):
        d.response_chunk(routed, b"data: {}\n\n", True)
    assert preds.samples == 3 and len(preds.tpot_predictions) == 4
    model = producer.predictor.tpot_model
    assert model is not None
    now = EndpointState(float(routed.request.prompt_tokens), 0.0, float(routed.endpoint.queue),
                        14.0, 0.9, float(routed.endpoint.inflight_tokens))
    assert preds.tpot_predictions[1:] == [pytest.approx(model(now.tpot_x()))] * 3
    assert preds.tpot_predictions[1] > preds.tpot_predictions[0]  # busier than at the pick


def test_the_reported_predicted_tpot_is_the_mean_of_pick_and_stream() -> None:
    d, _ = sampled_director(
        "{streamingMode: true, maxDecodeTokenSamplesForPrediction: 2, samplingMean: 1}")
    labels = {"model_name": "m", "target_model_name": "m"}
    name = "inference_objective_request_predicted_tpot_seconds"

    def observed() -> tuple[float, float]:
        return (REGISTRY.get_sample_value(f"{name}_sum", labels) or 0.0,
                REGISTRY.get_sample_value(f"{name}_count", labels) or 0.0)

    before = observed()
    routed, preds = stream(d, 1)
    from epp.datastore import EndpointMetrics

    d.datastore.record_scrape(routed.endpoint, EndpointMetrics(waiting=3, running=9))
    for _ in range(50):
        d.response_chunk(routed, b"data: {}\n\n", True)
    d.finish(routed, completed=True, status=200, response_size=1, prompt_tokens=5,
             completion_tokens=51)
    assert len(preds.tpot_predictions) == 3
    after = observed()
    assert after[1] == before[1] + 1
    assert after[0] - before[0] == pytest.approx(sum(preds.tpot_predictions) / 3)


@pytest.mark.parametrize("params", [
    "{streamingMode: true}",  # maxDecodeTokenSamplesForPrediction 0: upstream's default
    "{streamingMode: false, maxDecodeTokenSamplesForPrediction: 5, samplingMean: 1}",
])
def test_without_sampling_only_the_pick_predicts_tpot(params: str) -> None:
    d, _ = sampled_director(params)
    _, preds = stream(d, 100)
    assert len(preds.tpot_predictions) == 1 and preds.samples == 0


@pytest.mark.parametrize(("params", "field"), [
    ("{samplingMean: 0}", "samplingMean"),
    ("{maxDecodeTokenSamplesForPrediction: -1}", "maxDecodeTokenSamplesForPrediction"),
])
def test_bad_sampling_parameters_name_the_field(params: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build(parse_config(LATENCY_CONFIG.replace("{streamingMode: true}", params)), store())
