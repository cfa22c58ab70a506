"""Predicted latency: the request's SLO (headers), the online TTFT/TPOT model, and the
per-request predictions the SLO-aware plugins share (see docs/slo.md)."""

from epp.latency.predictor import LatencyPredictor, PredictorConfig
from epp.latency.slo import SLO, TPOT_SLO_HEADER, TTFT_SLO_HEADER, parse_slo

__all__ = ["SLO", "TPOT_SLO_HEADER", "TTFT_SLO_HEADER", "LatencyPredictor", "PredictorConfig",
           "parse_slo"]
