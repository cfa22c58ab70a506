"""The online latency model: TTFT and TPOT of a request on an endpoint, learnt from what the
servers actually did.

Features (upstream's predictor's, plus the uncached prompt as a product with the batch, the
count of requests in prefill and the endpoint's relative speed): TTFT ← prompt tokens, uncached
prompt tokens (prefix match), uncached * (running + 1), waiting queue, running requests,
KV-cache use, tokens in flight to the endpoint, prefill tokens in flight, requests in
prefill, the endpoint's recent TPOT relative to the pool's, uncached * that; TPOT ← the same
without the prefix terms, plus the endpoint's tokens in flight with this request over the
candidates' mean (``relative_inflight``).

Two models per latency, both linear and fitted by scikit-learn's ``QuantileRegressor``:

- the *central* one, at the median with weights 1/y, which minimises exactly the mean
  absolute *relative* error (MAPE), the way a point prediction is judged; a median fit is
  also not dragged by the minority of samples from a transient (a cold cache's backlog), as
  a least-squares fit is;
- the *quantile* one (``quantile``, 0.9 by default; upstream's predictor's default), fitted
  unweighted at that quantile: it minimises the pinball loss
  mean(max(q·(y - ŷ), (q - 1)·(y - ŷ))) (plus a small L1 penalty, :func:`quantile_penalty`),
  whose minimiser is the conditional q-quantile, so
  about a fraction q of requests finish within it. The SLO-aware plugins compare it with
  the SLO: "predicted to meet" then means "meets it 9 times in 10", not "half the time".
Fitting is scheduled by a background thread every ``retrain_interval`` seconds on the latest
``max_samples`` completed requests and, given an executor (the plugin gives it a one-worker
process pool), runs in another process, so it does not compete with the request path for
the GIL either; the fitted scaler and weights are folded into one weight
vector and swapped in with a single assignment, so the request path never waits on training
and a prediction is a dot product (microseconds, no scikit-learn call on the hot path).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

TTFT_FEATURES = ("prompt_tokens", "uncached_tokens", "uncached_x_running", "waiting",
                 "running", "kv_usage", "inflight_tokens", "prefill_tokens",
                 "prefill_requests", "relative_tpot", "uncached_x_relative_tpot")
TPOT_FEATURES = ("prompt_tokens", "waiting", "running", "kv_usage", "inflight_tokens",
                 "prefill_tokens", "prefill_requests", "relative_tpot", "relative_inflight")
#: Predictions never go below this (seconds): a linear model can extrapolate below zero.
FLOOR = 1e-4
#: Columns of a state row (:meth:`EndpointState.row`) that make the TTFT and the TPOT rows.
TTFT_COLUMNS = tuple(range(len(TTFT_FEATURES)))
TPOT_COLUMNS = (0, 3, 4, 5, 6, 7, 8, 9, 11)


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    """How often and on what the model is retrained."""

    retrain_interval: float = 1.0
    max_samples: int = 5000
    min_samples: int = 20
    #: The quantile the second model of each latency is fitted at (None: central only).
    quantile: float | None = 0.9
    #: Step of the online coverage correction of the quantile predictions, on the log
    #: scale (0: served as fitted). 0.005: one miss raises them ~0.5%, one hit lowers them
    #: ~0.05%, in balance at a miss rate of 1 - quantile. The step trades how fast a drift
    #: is followed against the noise it adds to every prediction: on the calibration
    #: scenario's tuning seeds 100-104, 0.02 / 0.01 / 0.06 per tercile gave lowest-tercile
    #: coverage 0.84 / 0.85 / 0.79 and pinball 0.18 / 0.17 / 0.22 ms; once the fit was
    #: regularised and warmed up (``calibration_warmup``) the fit itself covered 0.89-0.91
    #: and 0.01 added more noise than it removed bias (seeds 1-3, pinball 0.97x -> 0.95x
    #: of the best constant with 0.005, lowest tercile 0.83 -> 0.86).
    calibration_rate: float = 0.005
    #: The coverage correction is kept per bucket of the quantile model's raw value: this
    #: many buckets, split at equal-count quantiles of the fit's own predictions on its
    #: samples (3: terciles; 1: one correction for all). One factor for all requests evens
    #: out coverage overall while a low tercile stays under-covered and a high one
    #: over-covered (seen: 0.84 / 1.00 around 0.93 overall); a factor per bucket aims each
    #: bucket at ``quantile`` on its own.
    calibration_buckets: int = 3
    #: The correction moves only once the quantile model in use was fitted on at least
    #: this many samples. Before, a miss says the fit is young (a p90 line fitted on 20
    #: samples, two of them above it), not that latencies drifted, and the correction's
    #: asymmetric steps keep what it learnt then for long: on the calibration scenario the
    #: lowest bucket's offset rose to +0.15-0.20 over the first 200 requests and took about
    #: 800 more to come back, over-covering the high tercile (0.97) and costing pinball loss
    #: (seeds 1-3: 1.06x -> 1.01x of the best constant).
    calibration_warmup: int = 200

    def __post_init__(self) -> None:
        if self.quantile is not None and not 0 < self.quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile!r}")
        if not 0 <= self.calibration_rate < 1:
            raise ValueError(f"calibration_rate must be in [0, 1), got "
                             f"{self.calibration_rate!r}")
        if self.calibration_warmup < 0:
            raise ValueError(f"calibration_warmup must be >= 0, got "
                             f"{self.calibration_warmup!r}")
        if self.calibration_buckets < 1:
            raise ValueError(f"calibration_buckets must be >= 1, got "
                             f"{self.calibration_buckets!r}")


@dataclass(frozen=True, slots=True)
class EndpointState:
    """What the model sees of one endpoint for one request."""

    prompt_tokens: float
    uncached_tokens: float
    waiting: float
    running: float
    kv_usage: float
    inflight_tokens: float
    #: Prompt tokens sent to the endpoint whose first token has not come back yet
    #: (upstream's prefill tokens in flight).
    prefill_tokens: float = 0.0
    #: Requests sent to the endpoint whose first token has not come back yet. With
    #: ``prefill_tokens`` it lets the model tell many short prefills from a few long ones,
    #: and absorb a per-request error of the uncached estimate (a prompt longer than the
    #: prefix index's hash window counts its unhashed tail as uncached even where the
    #: server has it cached).
    prefill_requests: float = 0.0
    #: The TPOT requests that finished on this endpoint measured lately (an exponential
    #: average) over the mean of the same across the pool's endpoints (1 when unknown).
    #: What tells a slow endpoint from a fast one in a heterogeneous pool: at the same load
    #: an A100-like pod decodes (and prefills) slower than an H100-like one, and no other
    #: input says which is which. A ratio, not the average itself: the average drifts with
    #: the pool's load over time, and a fit on it learns that drift (seen: TPOT p90
    #: coverage 0.91 -> 0.84 on a homogeneous pool); the ratio to the pool does not drift.
    relative_tpot: float = 1.0
    #: Tokens in flight to this endpoint once this request is there (its
    #: ``inflight_tokens`` plus the request's prompt at the pick) minus the mean tokens in
    #: flight over the candidates: how much more than its share the endpoint would hold.
    #: TPOT only. A load-aware router sends the next arrivals to the endpoints holding
    #: less, so an endpoint left above the mean gets fewer new prefills while this request
    #: decodes (each one lengthens a decode step), one below it more: on the calibration
    #: scenario its rank correlation with the measured TPOT is -0.28 to -0.38, stronger than
    #: any other input's (seeds 1-3), and it took the TPOT p90's pinball loss from 1.01x to
    #: 0.95x of the run's best constant (replayed offline on the same runs).
    relative_inflight: float = 0.0

    def ttft_x(self) -> tuple[float, ...]:
        return (self.prompt_tokens, self.uncached_tokens,
                self.uncached_tokens * (self.running + 1.0), self.waiting, self.running,
                self.kv_usage, self.inflight_tokens, self.prefill_tokens,
                self.prefill_requests, self.relative_tpot,
                self.uncached_tokens * self.relative_tpot)

    def row(self) -> tuple[float, ...]:
        """The whole state as one row: the TTFT features (:meth:`ttft_x`), then
        ``relative_inflight``; :data:`TTFT_COLUMNS` and :data:`TPOT_COLUMNS` pick each
        model's inputs from it."""
        return (*self.ttft_x(), self.relative_inflight)

    @classmethod
    def from_row(cls, row: Sequence[float]) -> EndpointState:
        """The state a :meth:`row` was made from."""
        return cls(row[0], row[1], row[3], row[4], row[5], row[6], row[7], row[8], row[9],
                   row[11])

    def tpot_x(self) -> tuple[float, ...]:
        return (self.prompt_tokens, self.waiting, self.running, self.kv_usage,
                self.inflight_tokens, self.prefill_tokens, self.prefill_requests,
                self.relative_tpot, self.relative_inflight)


@dataclass(frozen=True, slots=True)
class Linear:
    """A fitted model in raw feature space: y = intercept + sum w·x, clipped to
    [``low``, ``high``], the range of the latencies it was fitted on: a linear model
    extrapolates without bound (to zero or to many times the slowest request seen) in
    states its samples did not cover, and a prediction outside what was ever measured is
    less likely than the nearest measured extreme."""

    intercept: float
    weights: tuple[float, ...]
    low: float = FLOOR
    high: float = float("inf")

    def __call__(self, x: Sequence[float]) -> float:
        y = self.intercept
        for w, v in zip(self.weights, x, strict=True):
            y += w * v
        return self.low if y < self.low else self.high if y > self.high else y

    def many(self, x: Any) -> list[float]:
        """Predictions for the rows of the matrix ``x``."""
        import numpy as np

        return np.clip(x @ np.asarray(self.weights) + self.intercept, self.low,
                       self.high).tolist()


def fit_linear(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> Linear:
    """Fit a linear median regression on standardised features with weights 1/y: the
    weighted absolute error it minimises, sum |y' - y| / y, is the MAPE of the fit.

    scikit-learn's ``QuantileRegressor`` (no penalty) solves it as a linear program;
    HiGHS's interior-point solver takes ~0.3 s for 5,000 samples, in the worker process.
    """
    import numpy as np
    from sklearn.linear_model import QuantileRegressor

    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    model = QuantileRegressor(quantile=0.5, alpha=0.0, solver="highs-ipm")
    model.fit((x - mean) / std, y, sample_weight=1.0 / np.maximum(y, FLOOR))
    w = model.coef_ / std
    return Linear(float(model.intercept_ - (w * mean).sum()), tuple(float(v) for v in w),
                  max(float(y.min()), FLOOR), float(y.max()))


def fit_quantile(xs: Sequence[Sequence[float]], ys: Sequence[float], quantile: float,
                 ) -> Linear:
    """Fit a linear ``quantile`` regression (pinball loss, no weights) on standardised
    features: the fitted line leaves about a fraction ``quantile`` of the samples at or
    below it. Clipped to the range of the samples, like :func:`fit_linear`.

    With an L1 penalty of sqrt(q(1 - q) / n) per standardised weight
    (:func:`quantile_penalty`): a weight is kept only where it lowers the mean pinball
    loss by more than the noise of that loss's slope on n samples. Unpenalised, a fit on a
    few hundred samples, of which only a tenth lie above a p90 line, gives every input a
    weight fitted to noise; where the inputs carry little information (TPOT at a light,
    even load) those weights made the served p90 worse than a constant (calibration
    scenario, seeds 1-3, pinball 1.00x -> 0.99x of the run's best constant).
    """
    import numpy as np
    from sklearn.linear_model import QuantileRegressor

    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    model = QuantileRegressor(quantile=quantile, alpha=quantile_penalty(quantile, len(y)),
                              solver="highs-ipm")
    model.fit((x - mean) / std, y)
    w = model.coef_ / std
    return Linear(float(model.intercept_ - (w * mean).sum()), tuple(float(v) for v in w),
                  max(float(y.min()), FLOOR), float(y.max()))


def quantile_penalty(quantile: float, n: int) -> float:
    """The L1 penalty of :func:`fit_quantile` on ``n`` samples: sqrt(q(1 - q) / n), the
    standard deviation of the mean pinball loss's slope along a standardised input that
    carries no information (the scale of Belloni & Chernozhukov's penalty for l1 quantile
    regression, 2011, without their factor of about 3 for the maximum over inputs, which
    shrank the TPOT fit to the constant on the tuning seeds)."""
    return math.sqrt(quantile * (1.0 - quantile) / max(n, 1))


def pinball(predicted: Sequence[float], actual: Sequence[float], quantile: float) -> float:
    """Mean pinball (quantile) loss of ``predicted`` as ``quantile``-quantiles of
    ``actual``: under-prediction costs ``quantile`` per second, over-prediction
    1 - ``quantile``."""
    total = 0.0
    for p, a in zip(predicted, actual, strict=True):
        d = a - p
        total += quantile * d if d >= 0 else (quantile - 1.0) * d
    return total / len(actual) if actual else float("nan")


class LatencyPredictor:
    """Learns TTFT and TPOT from completed requests; predicts them for candidates: the
    central value (``predict``) and the configured quantile (``predict_quantile``).

    ``fit`` / ``fit_q`` are the fitting functions (tests wrap the real ones to hold a
    retrain open); with an ``executor`` they run there (they must then be picklable, as
    :func:`fit_linear` and :func:`fit_quantile` are).
    """

    def __init__(self, config: PredictorConfig | None = None,
                 fit: Callable[[Sequence[Sequence[float]], Sequence[float]], Linear] = fit_linear,
                 executor: Executor | None = None,
                 fit_q: Callable[[Sequence[Sequence[float]], Sequence[float], float],
                                 Linear] = fit_quantile) -> None:
        self.config = config or PredictorConfig()
        self._fit = fit
        self._fit_q = fit_q
        self.executor = executor
        n = self.config.max_samples
        # Ring buffers of the latest samples, as arrays: a retrain copies them out in one
        # memcpy instead of walking Python objects while holding the GIL.
        self._ttft = _Ring(n, len(TTFT_FEATURES))
        self._tpot = _Ring(n, len(TPOT_FEATURES))
        self._lock = threading.Lock()  # guards the sample buffers only, never a fit
        self._new_samples = 0
        #: The models in use (replaced whole by the trainer; None until trained).
        self.ttft_model: Linear | None = None
        self.tpot_model: Linear | None = None
        #: The ``config.quantile`` models (None until trained, or without a quantile).
        self.ttft_q_model: Linear | None = None
        self.tpot_q_model: Linear | None = None
        #: Per bucket of the quantile model's raw value, log of the factor its values are
        #: served times (moved by :meth:`observe`; 0 = as fitted), and the bucket edges
        #: (raw values, ascending; set at each fit).
        buckets = self.config.calibration_buckets
        self.ttft_offsets = [0.0] * buckets
        self.tpot_offsets = [0.0] * buckets
        self.ttft_edges: tuple[float, ...] = ()
        self.tpot_edges: tuple[float, ...] = ()
        #: Samples the quantile models in use were fitted on (0: none yet).
        self.ttft_q_fitted_on = 0
        self.tpot_q_fitted_on = 0
        self.retrains = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the request path ------------------------------------------------------------------

    def predict(self, state: EndpointState) -> tuple[float | None, float | None]:
        """(TTFT, TPOT) in seconds, None for a model not trained yet."""
        ttft, tpot = self.ttft_model, self.tpot_model
        return (ttft(state.ttft_x()) if ttft is not None else None,
                tpot(state.tpot_x()) if tpot is not None else None)

    def predict_quantile(self, state: EndpointState) -> tuple[float | None, float | None]:
        """(TTFT, TPOT) ``config.quantile``-quantiles in seconds (None: no such model):
        the quantile model's value times its online coverage correction, never on the
        wrong side of the central prediction (:func:`_uncross`)."""
        ttft, tpot = self.ttft_q_model, self.tpot_q_model
        centre = self.predict(state)
        q = self.config.quantile or 0.5
        return (_uncross(_corrected(ttft(state.ttft_x()), self.ttft_edges, self.ttft_offsets),
                         centre[0], q) if ttft is not None else None,
                _uncross(_corrected(tpot(state.tpot_x()), self.tpot_edges, self.tpot_offsets),
                         centre[1], q) if tpot is not None else None)

    def predict_rows(self, rows: Sequence[Sequence[float]], quantile: bool = False,
                     ) -> tuple[list[float] | None, list[float] | None]:
        """(TTFTs, TPOTs) for many :meth:`EndpointState.row` rows at once (one matrix
        product each; None for a model not trained yet); ``quantile``: the
        ``config.quantile`` models' instead of the central ones."""
        import numpy as np

        x = np.array(rows, dtype=float)
        ttft_x, tpot_x = x[:, TTFT_COLUMNS], x[:, TPOT_COLUMNS]
        ttft, tpot = self.ttft_model, self.tpot_model
        central = (ttft.many(ttft_x) if ttft is not None else None,
                   tpot.many(tpot_x) if tpot is not None else None)
        if not quantile:
            return central
        q = self.config.quantile or 0.5
        out: list[list[float] | None] = []
        for model, columns, centre, edges, offsets in (
                (self.ttft_q_model, ttft_x, central[0], self.ttft_edges, self.ttft_offsets),
                (self.tpot_q_model, tpot_x, central[1], self.tpot_edges, self.tpot_offsets)):
            if model is None:
                out.append(None)
                continue
            ys = [_corrected(y, edges, offsets) for y in model.many(columns)]
            out.append(ys if centre is None else
                       [_uncross(y, c, q) for y, c in zip(ys, centre, strict=True)])
        return out[0], out[1]

    def observe(self, state: EndpointState, ttft: float | None, tpot: float | None,
                served: tuple[float | None, float | None] | None = None) -> None:
        """A completed request: its endpoint's state at dispatch and what it measured. Also
        moves each quantile's coverage correction (:attr:`PredictorConfig.calibration_rate`):
        up when the measured value exceeded the quantile ``served`` for it at the pick (the
        (TTFT, TPOT) quantiles the request was judged by; None: what the models say for
        ``state`` now), down otherwise, so that in the long run a fraction ``quantile`` of
        requests is covered even while latencies drift away from what the last fit saw
        (adaptive conformal inference, Gibbs & Candes 2021, on the log scale). The values
        served at the pick, not recomputed ones: a model refitted since on later samples
        fits this request better than the one that judged it did.

        Only the endpoint a request was sent to completes it, so the correction learns from
        the residuals of picked endpoints alone: the population the router acts on. A pick
        by predicted headroom favours the candidates whose prediction erred low; their
        misses move the correction, the unpicked candidates' (unmeasurable) errors do not.

        The correction moved is that of the request's bucket
        (:attr:`PredictorConfig.calibration_buckets`): where the quantile model's raw value
        for ``state`` falls among the last fit's edges; none moves while the model in use
        was fitted on fewer than :attr:`PredictorConfig.calibration_warmup` samples."""
        rate, q = self.config.calibration_rate, self.config.quantile
        if rate and q is not None:
            if served is None:
                served = self.predict_quantile(state)
            step = rate * (1.0 - q)
            warm = self.config.calibration_warmup
            ttft_q = self.ttft_q_model if self.ttft_q_fitted_on >= warm else None
            tpot_q = self.tpot_q_model if self.tpot_q_fitted_on >= warm else None
            if ttft is not None and ttft > 0 and served[0] is not None and ttft_q is not None:
                i = _bucket(ttft_q(state.ttft_x()), self.ttft_edges)
                self.ttft_offsets[i] += rate * (ttft > served[0]) - step
            if tpot is not None and tpot > 0 and served[1] is not None and tpot_q is not None:
                i = _bucket(tpot_q(state.tpot_x()), self.tpot_edges)
                self.tpot_offsets[i] += rate * (tpot > served[1]) - step
        with self._lock:
            if ttft is not None and ttft > 0:
                self._ttft.add(state.ttft_x(), ttft)
            if tpot is not None and tpot > 0:
                self._tpot.add(state.tpot_x(), tpot)
            self._new_samples += 1

    # -- training, off the request path ----------------------------------------------------

    def retrain(self) -> bool:
        """Fit both models on the current samples now (the fit in the executor, else in the
        caller's thread); True when a model changed."""
        with self._lock:
            if not self._new_samples:
                return False
            self._new_samples = 0
            ttft, tpot = self._ttft.copy(), self._tpot.copy()
        changed = False
        n, q = self.config.min_samples, self.config.quantile
        if len(ttft[1]) >= n:
            self.ttft_model = self._run_fit(*ttft)
            if q is not None:
                self.ttft_q_model = self._run_fit(*ttft, q)
                self.ttft_edges = self._edges(self.ttft_q_model, ttft[0])
                self.ttft_q_fitted_on = len(ttft[1])
            changed = True
        if len(tpot[1]) >= n:
            self.tpot_model = self._run_fit(*tpot)
            if q is not None:
                self.tpot_q_model = self._run_fit(*tpot, q)
                self.tpot_edges = self._edges(self.tpot_q_model, tpot[0])
                self.tpot_q_fitted_on = len(tpot[1])
            changed = True
        if changed:
            self.retrains += 1
        return changed

    def _edges(self, model: Linear, xs: Any) -> tuple[float, ...]:
        """Bucket edges: the equal-count quantiles of ``model``'s values on its own
        training rows (``calibration_buckets - 1`` of them)."""
        import numpy as np

        k = self.config.calibration_buckets
        if k == 1:
            return ()
        ys = np.asarray(model.many(xs))
        return tuple(float(v) for v in np.quantile(ys, [i / k for i in range(1, k)]))

    def _run_fit(self, xs: Any, ys: Any, quantile: float | None = None) -> Linear:
        if quantile is None:
            fn: Callable[..., Linear] = self._fit
            args: tuple[Any, ...] = (xs, ys)
        else:
            fn, args = self._fit_q, (xs, ys, quantile)
        if self.executor is None:
            return fn(*args)
        return self.executor.submit(fn, *args).result()

    def start(self) -> None:
        """Retrain every ``retrain_interval`` seconds in a daemon thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="latency-predictor",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the retraining schedule (the executor is left to its owner)."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.config.retrain_interval):
            try:
                self.retrain()
            except Exception as e:
                _log_fit_failure(e)

    @property
    def samples(self) -> int:
        """TTFT samples held (at most ``max_samples``)."""
        return self._ttft.size


def _bucket(raw: float, edges: Sequence[float]) -> int:
    """Index of the bucket ``raw`` falls in (edges ascending; 0 before any fit)."""
    return bisect.bisect_right(edges, raw)


def _corrected(raw: float, edges: Sequence[float], offsets: Sequence[float]) -> float:
    """``raw`` times its bucket's coverage correction."""
    return raw * math.exp(offsets[_bucket(raw, edges)])


def _uncross(y_q: float, centre: float | None, q: float) -> float:
    """Two separately fitted linear quantile models can cross where their samples are thin
    (a p90 below the median); sorting the two predictions (Chernozhukov et al.'s
    rearrangement) puts a q > 0.5 quantile at or above the central value, a q < 0.5 one at
    or below it."""
    if centre is None:
        return y_q
    return max(y_q, centre) if q >= 0.5 else min(y_q, centre)


class _Ring:
    """The latest ``capacity`` (x, y) rows in preallocated arrays."""

    def __init__(self, capacity: int, width: int) -> None:
        import numpy as np

        self.x = np.zeros((capacity, width))
        self.y = np.zeros(capacity)
        self.size = 0
        self._next = 0

    def add(self, x: Sequence[float], y: float) -> None:
        i = self._next
        self.x[i] = x
        self.y[i] = y
        self._next = (i + 1) % len(self.y)
        self.size = min(self.size + 1, len(self.y))

    def copy(self) -> tuple[Any, Any]:
        return self.x[: self.size].copy(), self.y[: self.size].copy()


def _log_fit_failure(e: Exception) -> None:
    import structlog

    structlog.get_logger(__name__).warning("latency model fit failed", error=str(e))


__all__ = ["FLOOR", "TPOT_COLUMNS", "TPOT_FEATURES", "TTFT_COLUMNS", "TTFT_FEATURES",
           "EndpointState", "LatencyPredictor", "Linear", "PredictorConfig", "fit_linear",
           "fit_quantile", "pinball", "quantile_penalty"]
