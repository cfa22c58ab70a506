"""Quantile (p90) latency predictions: the online quantile learner is calibrated on a known
distribution, the SLO-aware plugins judge candidates by the quantile (not the central
value), and the producer's quantile parameters are validated. Real predictor, real
producer, real filter and scorer over real endpoint views; no stubs."""

from __future__ import annotations

import math
import random

import pytest

from epp.config import ConfigError, build, parse_config
from epp.latency.predictions import PREDICTIONS_KEY, predictions_of
from epp.latency.predictor import (
    EndpointState,
    LatencyPredictor,
    PredictorConfig,
    fit_quantile,
    pinball,
)
from epp.requestcontrol import Director
from epp.requestcontrol.plugins.predicted_latency_producer import (
    PredictedLatencyParameters,
    PredictedLatencyProducer,
)
from epp.scheduling import LLMRequest
from epp.scheduling.plugins.filter.slo_headroom_tier_filter import (
    SloHeadroomTierFilter,
    TierFilterParameters,
)
from epp.scheduling.plugins.scorer.latency_scorer import LatencyScorer
from tests.epp.unit.test_director import HEADERS, body, store
from tests.epp.unit.test_slo import LATENCY_CONFIG
from tests.support.views import build_view

#: z of the standard normal's 0.9 quantile.
Z90 = 1.2815515655446004


def _sample(rng: random.Random) -> tuple[EndpointState, float, float]:
    """A state and its TTFT and TPOT drawn from a known distribution whose spread grows
    with load (heteroscedastic, as real latencies are): TPOT = 10 ms + 2 ms per running
    request + N(0, (1 ms + 0.5 ms per running)^2), so its true p90 is
    mean + Z90 * sd; TTFT likewise in the uncached tokens."""
    running = rng.randint(0, 20)
    uncached = rng.uniform(0, 2000)
    s = EndpointState(200.0, uncached, 0.0, float(running), 0.2, 0.0)
    tpot = 0.010 + 0.002 * running + rng.gauss(0, 0.001 + 0.0005 * running)
    ttft = 0.05 + 0.0004 * uncached + rng.gauss(0, 0.005 + 0.0001 * uncached)
    return s, max(ttft, 1e-3), max(tpot, 1e-3)


def _trained(n: int, seed: int, quantile: float = 0.9) -> LatencyPredictor:
    rng = random.Random(seed)
    p = LatencyPredictor(PredictorConfig(min_samples=20, max_samples=n, quantile=quantile))
    for _ in range(n):
        p.observe(*_sample(rng))
    assert p.retrain()
    return p


@pytest.mark.parametrize("quantile", [0.9, 0.5])
def test_the_quantile_learner_covers_its_quantile_overall_and_per_tercile(
        quantile: float) -> None:
    p = _trained(3000, seed=1, quantile=quantile)
    rng = random.Random(2)   # fresh requests, not the training samples
    rows = [_sample(rng) for _ in range(6000)]
    pred = [p.predict_quantile(s)[1] for s, _, _ in rows]
    assert all(x is not None for x in pred)
    hits = [a <= q for q, (_, _, a) in zip(pred, rows, strict=True) if q is not None]
    assert abs(sum(hits) / len(hits) - quantile) < 0.02
    # Per tercile of the predicted value: calibrated where the spread is small and large.
    order = sorted(range(len(pred)), key=lambda i: pred[i] or 0.0)
    third = len(order) // 3
    for k in range(3):
        part = order[k * third:(k + 1) * third]
        cover = sum(hits[i] for i in part) / len(part)
        assert abs(cover - quantile) < 0.04, (k, cover)


def test_the_quantile_model_converges_to_the_true_conditional_quantile() -> None:
    p = _trained(3000, seed=3)
    for running in (0, 10, 20):
        s = EndpointState(200.0, 500.0, 0.0, float(running), 0.2, 0.0)
        true_p90 = 0.010 + 0.002 * running + Z90 * (0.001 + 0.0005 * running)
        _, tpot_q = p.predict_quantile(s)
        assert tpot_q == pytest.approx(true_p90, rel=0.08)
        _, central = p.predict(s)
        assert central is not None and central < tpot_q  # p90 sits above the centre


def test_the_quantile_model_beats_the_central_one_and_a_constant_on_pinball_loss() -> None:
    p = _trained(3000, seed=4)
    rng = random.Random(5)
    rows = [_sample(rng) for _ in range(4000)]
    actual = [a for _, _, a in rows]
    q = [p.predict_quantile(s)[1] or 0.0 for s, _, _ in rows]
    central = [p.predict(s)[1] or 0.0 for s, _, _ in rows]
    const = sorted(actual)[int(0.9 * len(actual))]
    assert pinball(q, actual, 0.9) < pinball(central, actual, 0.9)
    assert pinball(q, actual, 0.9) < pinball([const] * len(actual), actual, 0.9)


def test_pinball_loss_weighs_under_prediction_by_the_quantile() -> None:
    assert pinball([1.0], [2.0], 0.9) == pytest.approx(0.9)
    assert pinball([2.0], [1.0], 0.9) == pytest.approx(0.1)
    assert math.isnan(pinball([], [], 0.9))


def test_without_a_quantile_only_the_central_models_are_fitted() -> None:
    rng = random.Random(6)
    p = LatencyPredictor(PredictorConfig(min_samples=20, quantile=None))
    for _ in range(100):
        p.observe(*_sample(rng))
    assert p.retrain()
    assert p.tpot_model is not None and p.tpot_q_model is None
    assert p.predict_quantile(EndpointState(1, 1, 0, 0, 0, 0)) == (None, None)


# -- the SLO-aware plugins judge by the quantile ---------------------------------------------


def _two_pod_predictor() -> LatencyPredictor:
    """Pod 0 (idle): TTFT 200 ms +- 10 ms. Pod 1 (10 running): TTFT median 250 ms but a long
    tail (one request in four takes 600 ms): its mean and median meet a 300 ms SLO, its
    p90 does not."""
    rng = random.Random(7)
    p = LatencyPredictor(PredictorConfig(min_samples=20, quantile=0.9))
    for _ in range(400):
        p.observe(EndpointState(200.0, 200.0, 0.0, 0.0, 0.1, 0.0),
                  0.2 + rng.uniform(-0.01, 0.01), 0.01 + rng.uniform(-0.001, 0.001))
        slow = rng.random() < 0.25
        p.observe(EndpointState(200.0, 200.0, 0.0, 10.0, 0.1, 0.0),
                  (0.6 if slow else 0.24) + rng.uniform(-0.01, 0.01),
                  (0.05 if slow else 0.02) + rng.uniform(-0.001, 0.001))
    assert p.retrain()
    return p


def _request(ttft_ms: str | None = "300") -> LLMRequest:
    headers = {"x-slo-ttft-ms": ttft_ms} if ttft_ms else {}
    # 200 prompt tokens and no prefix producer (all uncached), as the samples above.
    return LLMRequest(request_id="r", target_model="m", client_model="m",
                      prompt=b"p" * 640, prompt_tokens=200, headers=headers)


def _produce(objective: str, ttft_ms: str | None = "300") -> tuple[LLMRequest, list]:
    vs = [build_view(0, running=0, kv=0.1), build_view(1, running=10, kv=0.1)]
    producer = PredictedLatencyProducer(
        params=PredictedLatencyParameters(streaming_mode=True, objective_type=objective),
        predictor=_two_pod_predictor())
    r = _request(ttft_ms)
    producer.produce(r, vs)
    return r, vs


def test_the_tier_filter_drops_an_endpoint_whose_p90_misses_the_slo_though_its_median_meets_it(
        ) -> None:
    r, vs = _produce("quantile")
    preds = predictions_of(r)
    assert preds is not None
    slow = preds.by_endpoint[vs[1].key]
    assert slow.ttft is not None and slow.ttft < 0.3          # the median meets the SLO
    assert slow.ttft_q is not None and slow.ttft_q > 0.3      # the p90 does not
    keep = SloHeadroomTierFilter(params=TierFilterParameters(0.0)).filter(r, vs)
    assert [v.key for v in keep] == [vs[0].key]
    # Judged by the central value (objectiveType: mean), both would pass: the test above
    # fails if the filter used the mean.
    r_mean, vs = _produce("mean")
    keep = SloHeadroomTierFilter(params=TierFilterParameters(0.0)).filter(r_mean, vs)
    assert [v.key for v in keep] == [vs[0].key, vs[1].key]


def test_the_latency_scorer_scores_only_endpoints_whose_p90_meets_the_slo() -> None:
    r, vs = _produce("quantile")
    assert LatencyScorer().score(r, vs)[1] == 0.0
    r_mean, vs = _produce("mean")
    assert LatencyScorer().score(r_mean, vs)[1] > 0.0


def test_without_an_slo_the_headroom_is_minus_the_p90() -> None:
    r, vs = _produce("quantile", ttft_ms=None)
    preds = r.plugin_state[PREDICTIONS_KEY]
    for v in vs:
        p = preds.by_endpoint[v.key]
        assert p.ttft_q is not None and p.ttft_headroom == pytest.approx(-p.ttft_q)


# -- parameters -------------------------------------------------------------------------------


@pytest.mark.parametrize(("params", "field"), [
    ("{quantile: 1.0}", "quantile"), ("{quantile: 0}", "quantile"),
    ("{quantile: -0.5}", "quantile"), ("{quantile: high}", "quantile"),
    ("{objectiveType: median}", "objectiveType"), ("{quantil: 0.9}", "quantil"),
])
def test_bad_quantile_parameters_name_the_field(params: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build(parse_config(LATENCY_CONFIG.replace("{streamingMode: true}", params)), store())


def test_the_quantile_parameter_reaches_the_predictor() -> None:
    rt = build(parse_config(LATENCY_CONFIG.replace(
        "{streamingMode: true}", "{streamingMode: true, quantile: 0.95, "
                                 "objectiveType: quantile}")), store())
    try:
        [producer] = rt.handle.find(PredictedLatencyProducer)
        assert producer.predictor.config.quantile == 0.95
        assert PredictedLatencyParameters().quantile == 0.9
        assert PredictedLatencyParameters().objective_type == "quantile"
    finally:
        for p in rt.handle.find(PredictedLatencyProducer):
            p.predictor.stop()


# -- a heterogeneous pool: the endpoint's recent TPOT -----------------------------------------


def test_the_producer_tells_a_slow_endpoint_from_a_fast_one_by_its_recent_tpot() -> None:
    """Two endpoints in the same scraped state, one decoding at 10 ms a token and one at
    25 ms (an H100-like and an A100-like pod): nothing the scrape says tells them apart, the
    TPOT they measured lately does, and the p90 the SLO filter reads follows it."""
    from epp.requestcontrol.plugin import Response
    from epp.scheduling.result import ProfileResult, SchedulingResult

    fast, slow = build_view(0, running=4, kv=0.2), build_view(1, running=4, kv=0.2)
    producer = PredictedLatencyProducer(params=PredictedLatencyParameters(
        streaming_mode=True, min_training_samples=20))
    rng = random.Random(8)
    for i in range(200):
        v = (fast, slow)[i % 2]
        r = _request(None)
        producer.produce(r, [v])
        producer.pre_request(r, SchedulingResult({"default": ProfileResult("default", [v])},
                                                 "default"))
        base = 0.010 if v is fast else 0.025
        tpot = base * rng.uniform(0.9, 1.1)
        producer.response_complete(r, Response("r", 200, completed=True, streamed=True,
                                               completion_tokens=50, ttft=0.1, tpot=tpot), v)
    assert producer.predictor.retrain()
    r = LLMRequest(request_id="r", target_model="m", client_model="m", prompt=b"p" * 640,
                   prompt_tokens=200, headers={"x-slo-ttft-ms": "2000", "x-slo-tpot-ms": "20"})
    producer.produce(r, [fast, slow])
    preds = predictions_of(r)
    assert preds is not None
    p_fast, p_slow = preds.by_endpoint[fast.key], preds.by_endpoint[slow.key]
    assert p_fast.tpot_q is not None and p_slow.tpot_q is not None
    assert p_fast.tpot_q < 0.015 < 0.022 < p_slow.tpot_q
    keep = SloHeadroomTierFilter(params=TierFilterParameters(0.0)).filter(r, [fast, slow])
    assert [v.key for v in keep] == [fast.key]


def test_a_quantile_model_never_predicts_below_the_central_one() -> None:
    """Fitted apart, two linear quantile models can cross where samples are thin; the p90
    served is never below the central prediction."""
    p = LatencyPredictor(PredictorConfig(min_samples=5, quantile=0.9))
    rng = random.Random(9)
    for _ in range(8):   # few samples: an unconstrained p90 line may cross the median one
        s = EndpointState(200.0, rng.uniform(0, 2000), 0.0, float(rng.randint(0, 20)), 0.2,
                          0.0)
        p.observe(s, 0.05 + rng.random(), 0.01 + 0.02 * rng.random())
    assert p.retrain()
    rows = [EndpointState(200.0, u, 0.0, float(n), 0.2, 0.0).row()
            for u in (0, 1000, 2000) for n in (0, 10, 20)]
    central, quant = p.predict_rows(rows), p.predict_rows(rows, quantile=True)
    for c, q in zip(central, quant, strict=True):
        assert c is not None and q is not None
        assert all(b >= a for a, b in zip(c, q, strict=True))


@pytest.mark.parametrize(("rate", "low", "high"), [(0.02, 0.86, 0.94), (0.0, 0.0, 0.6)])
def test_the_online_correction_keeps_coverage_when_latencies_drift_after_the_fit(
        rate: float, low: float, high: float) -> None:
    """Fitted on one regime, served on a slower one (every TPOT 1.4x, no refit in
    between): the coverage correction brings the served p90 back to covering about 90%
    (without it, rate 0, coverage collapses)."""
    rng = random.Random(10)
    p = LatencyPredictor(PredictorConfig(min_samples=20, max_samples=3000,
                                         calibration_rate=rate))
    for _ in range(3000):
        s, ttft, tpot = _sample(rng)
        p.observe(s, ttft, tpot)
    assert p.retrain()
    hits = []
    for _ in range(3000):
        s, ttft, tpot = _sample(rng)
        served = p.predict_quantile(s)[1]
        assert served is not None
        hits.append(1.4 * tpot <= served)
        p.observe(s, ttft, 1.4 * tpot)
    late = hits[1000:]
    assert low <= sum(late) / len(late) <= high


def test_a_bad_calibration_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="calibration_rate"):
        PredictorConfig(calibration_rate=-0.1)


@pytest.mark.parametrize(("buckets", "low_tercile_at_least", "low_tercile_below"),
                         [(3, 0.85, 1.01), (1, 0.0, 0.80)])
def test_the_correction_per_bucket_covers_each_tercile_when_drift_differs_by_level(
        buckets: int, low_tercile_at_least: float, low_tercile_below: float) -> None:
    """Fitted on one regime, served on one where only the lightly loaded requests got
    slower (TPOT 1.5x at 0-6 running, as before above): one correction for all requests
    evens out coverage overall but leaves the lowest tercile of the served p90
    under-covered (buckets 1); a correction per tercile of the prediction covers it."""
    rng = random.Random(11)
    p = LatencyPredictor(PredictorConfig(min_samples=20, max_samples=3000,
                                         calibration_buckets=buckets))
    for _ in range(3000):
        s, ttft, tpot = _sample(rng)
        p.observe(s, ttft, tpot)
    assert p.retrain()
    served_and_hit: list[tuple[float, bool]] = []
    for _ in range(4000):
        s, ttft, tpot = _sample(rng)
        if s.running <= 6:
            tpot *= 1.5
        served = p.predict_quantile(s)[1]
        assert served is not None
        served_and_hit.append((served, tpot <= served))
        p.observe(s, ttft, tpot)
    late = sorted(served_and_hit[1500:])
    overall = sum(h for _, h in late) / len(late)
    low = late[: len(late) // 3]
    low_coverage = sum(h for _, h in low) / len(low)
    assert 0.86 <= overall <= 0.95
    assert low_tercile_at_least <= low_coverage < low_tercile_below


def test_a_bad_bucket_count_is_refused() -> None:
    with pytest.raises(ValueError, match="calibration_buckets"):
        PredictorConfig(calibration_buckets=0)


def test_a_pick_carries_each_candidates_tokens_in_flight_over_the_candidates_mean() -> None:
    """``relative_inflight`` (a TPOT input): the tokens an endpoint would hold with this
    request, minus the mean the candidates hold now."""
    d = Director.of(build(parse_config(LATENCY_CONFIG), store(), rng=random.Random(0)))
    _, first = d.route(HEADERS, body("a first prompt " * 40), {})
    held = {first.endpoint.key: first.request.prompt_tokens}
    _, second = d.route(HEADERS, body("a second, shorter one"), {})
    states = second.request.plugin_state[PREDICTIONS_KEY].states
    mean = sum(held.values()) / len(states)
    for key, row in states.items():
        expected = held.get(key, 0) + second.request.prompt_tokens - mean
        assert EndpointState.from_row(row).relative_inflight == pytest.approx(expected)
        assert EndpointState.from_row(row).tpot_x()[-1] == pytest.approx(expected)


def _balanced_sample(rng: random.Random, see_load: bool = True,
                     ) -> tuple[EndpointState, float]:
    """A state and its TPOT where, as behind a load-aware router, an endpoint left above
    its share of the tokens in flight receives fewer new prefills while the request
    decodes: TPOT = 10 ms + 1.5 ms per prefill landing during the decode, Poisson with a
    mean of 2 at the pool's mean load, 0.5 at 2,000 tokens over it, 3.5 at 2,000 under.
    Every other input is noise. ``see_load``: False hides the relative load (0)."""
    rel = rng.uniform(-2000.0, 2000.0)
    mean = 2.0 - 0.00075 * rel
    arrivals, t = 0, rng.expovariate(1.0)
    while t < mean:
        arrivals += 1
        t += rng.expovariate(1.0)
    s = EndpointState(rng.uniform(100, 3000), 0.0, 0.0, float(rng.randint(0, 6)),
                      rng.uniform(0, 0.02), rng.uniform(0, 5000),
                      relative_inflight=rel if see_load else 0.0)
    return s, 0.010 + 0.0015 * arrivals + rng.gauss(0, 0.0003)


@pytest.mark.parametrize("see_load", [True, False])
def test_the_relative_load_lets_the_p90_beat_the_best_constant(see_load: bool) -> None:
    """On a stream where TPOT depends on the endpoint's load relative to the pool and on
    nothing else the model reads, the p90 fitted with that input beats the best constant
    (the fresh stream's own p90) by more than 10% on pinball loss; without it (0 for
    every request) it cannot do better than about that constant."""
    rng = random.Random(21)
    p = LatencyPredictor(PredictorConfig(min_samples=20, max_samples=2000))
    for _ in range(2000):
        s, tpot = _balanced_sample(rng, see_load)
        p.observe(s, None, tpot)
    assert p.retrain()
    fresh = [_balanced_sample(rng, see_load) for _ in range(4000)]
    actual = [t for _, t in fresh]
    served = [p.predict_quantile(s)[1] or 0.0 for s, _ in fresh]
    const = sorted(actual)[int(0.9 * len(actual))]
    ratio = pinball(served, actual, 0.9) / pinball([const] * len(actual), actual, 0.9)
    if see_load:
        assert ratio < 0.9
    else:
        assert ratio > 0.97


def test_inputs_that_carry_nothing_get_no_weight_on_a_few_hundred_samples() -> None:
    """TPOT independent of every input, 300 samples (30 above a p90 line): the penalised
    fit keeps (about) the constant and loses nothing to it on fresh requests; an
    unpenalised fit gives each of the 9 inputs a weight fitted to noise and loses ~3%."""
    rng = random.Random(22)

    def draw() -> tuple[tuple[float, ...], float]:
        s = EndpointState(rng.uniform(100, 3000), 0.0, float(rng.randint(0, 2)),
                          float(rng.randint(0, 6)), rng.uniform(0, 0.02),
                          rng.uniform(0, 5000), rng.uniform(0, 2000), rng.randint(0, 2),
                          rng.uniform(0.9, 1.1), rng.uniform(-2000, 2000))
        return s.tpot_x(), 0.0095 + rng.lognormvariate(-8.0, 0.6)

    train = [draw() for _ in range(300)]
    model = fit_quantile([x for x, _ in train], [y for _, y in train], 0.9)
    const = sorted(y for _, y in train)[int(0.9 * len(train))]
    fresh = [draw() for _ in range(20000)]
    actual = [y for _, y in fresh]
    fitted = pinball([model(x) for x, _ in fresh], actual, 0.9)
    assert fitted <= 1.005 * pinball([const] * len(actual), actual, 0.9)


def test_the_correction_waits_for_a_fit_on_enough_samples() -> None:
    """While the quantile model in use was fitted on fewer than ``calibration_warmup``
    samples its misses say the fit is young, not that latencies drifted: the correction
    does not move; once a fit on enough samples serves, it does."""
    rng = random.Random(23)
    p = LatencyPredictor(PredictorConfig(min_samples=20, calibration_warmup=200))
    for _ in range(20):
        p.observe(*_sample(rng))
    assert p.retrain() and p.tpot_q_fitted_on == 20
    for _ in range(100):   # every one a miss
        s, ttft, tpot = _sample(rng)
        p.observe(s, ttft, 10 * tpot)
    assert p.tpot_offsets == [0.0, 0.0, 0.0] and p.ttft_offsets == [0.0, 0.0, 0.0]
    assert p.retrain() and p.tpot_q_fitted_on == 120 < 200
    for _ in range(100):
        p.observe(*_sample(rng))
    assert p.retrain() and p.tpot_q_fitted_on == 220
    s, ttft, tpot = _sample(rng)
    p.observe(s, ttft, 100 * tpot)   # a miss under a fit on 220 samples
    assert max(p.tpot_offsets) == pytest.approx(0.005 * 0.9)


def test_a_bad_calibration_warmup_is_refused() -> None:
    with pytest.raises(ValueError, match="calibration_warmup"):
        PredictorConfig(calibration_warmup=-1)
