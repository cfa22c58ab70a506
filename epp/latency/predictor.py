"""The online latency model: TTFT and TPOT of a request on an endpoint, learnt from what the
servers actually did.

Features (upstream's predictor's, plus the uncached prompt as a product with the batch):
TTFT ← prompt tokens, uncached prompt tokens (prefix match), uncached * (running + 1),
waiting queue, running requests, KV-cache use, tokens in flight to the endpoint; TPOT ←
prompt tokens, waiting queue, running requests, KV-cache use, tokens in flight.

Model: scikit-learn's ``BayesianRidge`` (one of upstream's predictor's model types), fitted
with weights 1/y² so that it minimises *relative* error, the way the model is judged (MAPE).
Fitting runs in a background thread every ``retrain_interval`` seconds on the latest
``max_samples`` completed requests; the fitted scaler and weights are folded into one weight
vector and swapped in with a single assignment, so the request path never waits on training
and a prediction is a dot product (microseconds, no scikit-learn call on the hot path).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

TTFT_FEATURES = ("prompt_tokens", "uncached_tokens", "uncached_x_running", "waiting",
                 "running", "kv_usage", "inflight_tokens")
TPOT_FEATURES = ("prompt_tokens", "waiting", "running", "kv_usage", "inflight_tokens")
#: Predictions never go below this (seconds): a linear model can extrapolate below zero.
FLOOR = 1e-4


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    """How often and on what the model is retrained."""

    retrain_interval: float = 1.0
    max_samples: int = 5000
    min_samples: int = 20


@dataclass(frozen=True, slots=True)
class EndpointState:
    """What the model sees of one endpoint for one request."""

    prompt_tokens: float
    uncached_tokens: float
    waiting: float
    running: float
    kv_usage: float
    inflight_tokens: float

    def ttft_x(self) -> tuple[float, ...]:
        return (self.prompt_tokens, self.uncached_tokens,
                self.uncached_tokens * (self.running + 1.0), self.waiting, self.running,
                self.kv_usage, self.inflight_tokens)

    def tpot_x(self) -> tuple[float, ...]:
        return (self.prompt_tokens, self.waiting, self.running, self.kv_usage,
                self.inflight_tokens)


@dataclass(frozen=True, slots=True)
class Linear:
    """A fitted model in raw feature space: y = intercept + sum w·x."""

    intercept: float
    weights: tuple[float, ...]

    def __call__(self, x: Sequence[float]) -> float:
        y = self.intercept
        for w, v in zip(self.weights, x, strict=True):
            y += w * v
        return y if y > FLOOR else FLOOR


def fit_linear(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> Linear:
    """Fit BayesianRidge on standardised features, weights 1/y² (relative error)."""
    import numpy as np
    from sklearn.linear_model import BayesianRidge

    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    model = BayesianRidge()
    model.fit((x - mean) / std, y, sample_weight=1.0 / np.maximum(y, FLOOR) ** 2)
    w = model.coef_ / std
    return Linear(float(model.intercept_ - (w * mean).sum()), tuple(float(v) for v in w))


class LatencyPredictor:
    """Learns TTFT and TPOT from completed requests; predicts them for candidates.

    ``fit`` is the fitting function (tests wrap the real one to hold a retrain open).
    """

    def __init__(self, config: PredictorConfig | None = None,
                 fit: Callable[[Sequence[Sequence[float]], Sequence[float]], Linear] = fit_linear,
                 ) -> None:
        self.config = config or PredictorConfig()
        self._fit = fit
        self._ttft_samples: deque[tuple[tuple[float, ...], float]] = deque(
            maxlen=self.config.max_samples)
        self._tpot_samples: deque[tuple[tuple[float, ...], float]] = deque(
            maxlen=self.config.max_samples)
        self._lock = threading.Lock()  # guards the sample buffers only, never a fit
        self._new_samples = 0
        #: The models in use (replaced whole by the trainer; None until trained).
        self.ttft_model: Linear | None = None
        self.tpot_model: Linear | None = None
        self.retrains = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the request path ------------------------------------------------------------------

    def predict(self, state: EndpointState) -> tuple[float | None, float | None]:
        """(TTFT, TPOT) in seconds, None for a model not trained yet."""
        ttft, tpot = self.ttft_model, self.tpot_model
        return (ttft(state.ttft_x()) if ttft is not None else None,
                tpot(state.tpot_x()) if tpot is not None else None)

    def observe(self, state: EndpointState, ttft: float | None, tpot: float | None) -> None:
        """A completed request: its endpoint's state at dispatch and what it measured."""
        with self._lock:
            if ttft is not None and ttft > 0:
                self._ttft_samples.append((state.ttft_x(), ttft))
            if tpot is not None and tpot > 0:
                self._tpot_samples.append((state.tpot_x(), tpot))
            self._new_samples += 1

    # -- training, off the request path ----------------------------------------------------

    def retrain(self) -> bool:
        """Fit both models on the current samples now (in the caller's thread); True when a
        model changed."""
        with self._lock:
            if not self._new_samples:
                return False
            self._new_samples = 0
            ttft = list(self._ttft_samples)
            tpot = list(self._tpot_samples)
        changed = False
        n = self.config.min_samples
        if len(ttft) >= n:
            self.ttft_model = self._fit([x for x, _ in ttft], [y for _, y in ttft])
            changed = True
        if len(tpot) >= n:
            self.tpot_model = self._fit([x for x, _ in tpot], [y for _, y in tpot])
            changed = True
        if changed:
            self.retrains += 1
        return changed

    def start(self) -> None:
        """Retrain every ``retrain_interval`` seconds in a daemon thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="latency-predictor",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.config.retrain_interval):
            try:
                self.retrain()
            except Exception as e:
                _log_fit_failure(e)

    @property
    def samples(self) -> int:
        return len(self._ttft_samples)


def _log_fit_failure(e: Exception) -> None:
    import structlog

    structlog.get_logger(__name__).warning("latency model fit failed", error=str(e))


__all__ = ["FLOOR", "TPOT_FEATURES", "TTFT_FEATURES", "EndpointState", "LatencyPredictor",
                      "Linear", "PredictorConfig", "fit_linear"]
