"""What a client sees for each outcome: status, OpenAI-style body, and ``retry-after``."""

from __future__ import annotations

import orjson
import pytest

from epp.flowcontrol import Outcome, error_for
from shared.errors import BadRequest
from shared.responses import immediate_error


@pytest.mark.parametrize(("outcome", "status", "code"), [
    (Outcome.REJECTED_CAPACITY, 429, "flow_control_queue_full"),
    (Outcome.EVICTED_DISPLACED, 429, "flow_control_displaced"),
    (Outcome.EVICTED_TTL, 503, "flow_control_ttl_expired"),
    (Outcome.EVICTED_CONTEXT_CANCELLED, 503, "client_disconnected"),
    (Outcome.EVICTED_OTHER, 503, "flow_control_unavailable"),
    (Outcome.REJECTED_OTHER, 503, "flow_control_unavailable"),
])
def test_each_refusal_becomes_an_openai_error_with_retry_after(outcome: Outcome, status: int,
                                                               code: str) -> None:
    err = error_for(outcome, retry_after=7)
    assert err is not None
    resp = immediate_error(err).immediate_response
    assert resp.status.code == status
    headers = {h.header.key: h.header.raw_value.decode() for h in resp.headers.set_headers}
    assert headers == {"content-type": "application/json", "retry-after": "7"}
    body = orjson.loads(resp.body)
    assert body["error"]["code"] == code
    assert body["error"]["type"] in ("rate_limit_error", "service_unavailable")
    assert body["error"]["message"]


def test_dispatched_is_no_error() -> None:
    assert error_for(Outcome.DISPATCHED, retry_after=1) is None


def test_errors_without_retry_after_send_no_such_header() -> None:
    resp = immediate_error(BadRequest("nope")).immediate_response
    assert [h.header.key for h in resp.headers.set_headers] == ["content-type"]
