"""Errors that end a request with an HTTP status and an OpenAI-style JSON body.

Raise one of these anywhere below a stream handler; the stream machinery turns it into an
Envoy ``ImmediateResponse`` in one place (:func:`shared.responses.immediate_error`).
"""

from __future__ import annotations


class GatewayError(Exception):
    """A request-ending error: ``status`` is the HTTP status sent to the client."""

    status: int = 500
    type: str = "internal_error"
    code: str = "internal_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def to_json(self) -> dict[str, dict[str, str]]:
        """The OpenAI error shape: ``{"error": {"message", "type", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}


class BadRequest(GatewayError):
    """400: the body is not JSON, not an object, or misses a required field."""

    status = 400
    type = "invalid_request_error"
    code = "bad_request"


class NotFound(GatewayError):
    """404: nothing serves the requested model."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class PayloadTooLarge(GatewayError):
    """413: the request body is over the configured cap."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class TooManyRequests(GatewayError):
    """429: shed by admission control or no capacity for this priority."""

    status = 429
    type = "rate_limit_error"
    code = "too_many_requests"


class ServiceUnavailable(GatewayError):
    """503: no ready endpoint can take the request."""

    status = 503
    type = "service_unavailable"
    code = "no_endpoints"


class DirectResponse(GatewayError):
    """Not an error: the service answers the request itself (BBR's ``GET /v1/models``).

    Raised like the errors so that ending a request at the gateway has one path through the
    stream machinery; ``payload`` is sent as is (JSON) with ``status``.
    """

    def __init__(self, payload: bytes, status: int = 200) -> None:
        super().__init__("answered by the gateway", code="answered")
        self.status = status
        self.payload = payload
