"""What a client sees for each outcome: status, OpenAI-style body, and ``retry-after``."""

from __future__ import annotations

import orjson
import pytest

from epp.flowcontrol import Outcome, error_for
from shared.errors import BadRequest
from shared.responses import immediate_error


@pytest.mark.parametrize(("outcome", "pool_empty", "status", "code", "reason"), [
    (Outcome.REJECTED_CAPACITY, False, 429, "flow_control_queue_full", "rejected-saturated"),
    (Outcome.REJECTED_CAPACITY, True, 503, "no_endpoints", "rejected-no-endpoints"),
    (Outcome.REJECTED_NO_ENDPOINTS, False, 503, "no_endpoints", "rejected-no-endpoints"),
    (Outcome.EVICTED_DISPLACED, False, 429, "flow_control_displaced", "evicted-queue-pressure"),
    (Outcome.EVICTED_TTL, False, 429, "flow_control_ttl_expired", "rejected-ttl-expired"),
    (Outcome.EVICTED_TTL, True, 503, "no_endpoints", "rejected-no-endpoints"),
    (Outcome.EVICTED_CONTEXT_CANCELLED, False, 503, "client_disconnected",
     "rejected-context-cancelled"),
    (Outcome.EVICTED_OTHER, False, 503, "flow_control_unavailable", "rejected-shutting-down"),
    (Outcome.REJECTED_OTHER, False, 503, "flow_control_unavailable", "rejected-shutting-down"),
])
def test_each_refusal_becomes_an_openai_error_with_retry_after_and_reason(
        outcome: Outcome, pool_empty: bool, status: int, code: str, reason: str) -> None:
    """llm-d-router v0.10: 429 while the pool has endpoints (backpressure), 503 when it has
    none, each naming its reason in ``x-llm-d-request-dropped-reason``."""
    err = error_for(outcome, retry_after=7, pool_empty=pool_empty)
    assert err is not None
    resp = immediate_error(err).immediate_response
    assert resp.status.code == status
    headers = {h.header.key: h.header.raw_value.decode() for h in resp.headers.set_headers}
    assert headers == {"content-type": "application/json", "retry-after": "7",
                       "x-llm-d-request-dropped-reason": reason}
    body = orjson.loads(resp.body)
    assert body["error"]["code"] == code
    assert body["error"]["type"] in ("rate_limit_error", "service_unavailable")
    assert body["error"]["message"]


def test_dispatched_is_no_error() -> None:
    assert error_for(Outcome.DISPATCHED, retry_after=1) is None


def test_errors_without_retry_after_send_no_such_header() -> None:
    resp = immediate_error(BadRequest("nope")).immediate_response
    assert [h.header.key for h in resp.headers.set_headers] == ["content-type"]
