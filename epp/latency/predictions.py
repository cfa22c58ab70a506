"""What ``predicted-latency-producer`` leaves on a request for the SLO-aware filters, scorer
and admitter (upstream's ``LatencyPredictionInfo`` endpoint attribute)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epp.latency.slo import SLO
from epp.scheduling.request import LLMRequest

#: The key in ``LLMRequest.plugin_state``.
PREDICTIONS_KEY = "predicted-latency"


@dataclass(slots=True)
class Prediction:
    """One candidate's prediction. ``ttft`` / ``tpot``: the central (least-MAPE) values;
    ``ttft_q`` / ``tpot_q``: the producer's ``quantile`` (p90 by default; None without a
    quantile model). Headroom = SLO * sloBufferFactor - the judged prediction (seconds: the
    quantile with ``objectiveType: quantile``, the default, else the central value); without
    any SLO it is -predicted (lower latency = closer to 0); a dimension without an SLO or
    without a trained model is neutral (0). ``dispatched``: requests in flight there from
    this EPP."""

    ttft: float | None
    tpot: float | None
    ttft_headroom: float
    tpot_headroom: float
    prefix_score: float
    dispatched: int
    kv_usage: float
    waiting: int
    ttft_q: float | None = None
    tpot_q: float | None = None

    @property
    def valid(self) -> bool:
        """Predicted to meet the request's SLO (both headrooms ≥ 0)."""
        return self.ttft_headroom >= 0 and self.tpot_headroom >= 0


@dataclass(slots=True)
class RequestPredictions:
    """Per endpoint key: the state the model saw and its prediction."""

    slo: SLO
    predicted: bool = False
    by_endpoint: dict[str, Prediction] = field(default_factory=dict)
    #: Per endpoint key: matched / total prompt blocks (approximate prefix index).
    prefix_scores: dict[str, float] = field(default_factory=dict)
    #: Per endpoint key: the state the model read, as a row (:meth:`EndpointState.row`).
    states: dict[str, tuple[float, ...]] = field(default_factory=dict)
    #: The endpoint key whose prefill count holds this request (producer bookkeeping).
    prefilling_at: str | None = None
    #: The uncached prompt tokens this request added to ``prefilling_at``'s prefill count.
    prefill_charge: int = 0
    #: TPOT predicted for the picked endpoint: at the pick, then at each sampled token of
    #: the stream (``maxDecodeTokenSamplesForPrediction``); their mean is what is reported.
    tpot_predictions: list[float] = field(default_factory=list)
    #: In-stream sampling: streamed chunks so far (the first token's counts 1, as upstream
    #: counts generated tokens), the chunk of the next prediction, the predictions made in
    #: the stream, and the random source.
    tokens: int = 0
    next_sample: int = 0
    samples: int = 0
    sampler: Any = None


def predictions_of(request: LLMRequest) -> RequestPredictions | None:
    """The request's predictions (None when no ``predicted-latency-producer`` ran)."""
    found = request.plugin_state.get(PREDICTIONS_KEY)
    return found if isinstance(found, RequestPredictions) else None
