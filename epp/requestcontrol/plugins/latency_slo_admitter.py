"""``latency-slo-admitter`` (upstream v1.5): shed sheddable requests no endpoint can serve
within their SLO."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointView
from epp.latency.predictions import predictions_of
from epp.requestcontrol.plugin import Admitter
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest
from shared.errors import TooManyRequests

#: Below this KV-cache use an endpoint is cold: predictions are not trusted there.
COLD_KV = 0.02


class SloUnattainable(TooManyRequests):
    """429: a sheddable request whose SLO no endpoint is predicted to meet."""

    code = "slo_unattainable"


class LatencySloAdmitter(Plugin, Admitter):
    """Requests with priority ≥ 0, without an SLO, or before the model is trained pass.
    A sheddable request with an SLO passes when some candidate is predicted to meet it, is
    idle (nothing in flight from this EPP), or is cold (KV-cache use < 2%); else 429."""

    type_name = "latency-slo-admitter"

    def admit(self, request: LLMRequest, endpoints: Sequence[EndpointView]) -> None:
        if not request.sheddable:
            return
        preds = predictions_of(request)
        if preds is None or not preds.slo.any or not preds.predicted:
            return
        for v in endpoints:
            p = preds.by_endpoint.get(v.key)
            if (p is not None and p.valid) or v.inflight_requests == 0 \
                    or v.metrics.kv_usage < COLD_KV:
                return
        raise SloUnattainable("no endpoint is predicted to meet the request's latency SLO")
