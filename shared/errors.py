"""Errors that end a request with an HTTP status and an OpenAI-style JSON body.

Raise one of these anywhere below a stream handler; the stream machinery turns it into an
Envoy ``ImmediateResponse`` in one place (:func:`shared.responses.immediate_error`).
"""

from __future__ import annotations

from typing import Any


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

    #: Answer in Anthropic's envelope (set by :func:`for_path` on ``/v1/messages`` paths).
    anthropic: bool = False

    def to_json(self) -> dict[str, Any]:
        """The OpenAI error shape: ``{"error": {"message", "type", "code"}}``; on an Anthropic
        path Anthropic's: ``{"type": "error", "error": {"type", "message"}}`` (with our
        ``code`` beside them), its ``type`` named from the status as Anthropic names it."""
        if self.anthropic:
            kind = ANTHROPIC_TYPES.get(self.status, "api_error")
            return {"type": "error",
                    "error": {"type": kind, "message": self.message, "code": self.code}}
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}


#: Anthropic's error ``type`` for each status (https://docs.anthropic.com/en/api/errors);
#: 503 has no name there: ``overloaded_error`` is what Anthropic sends when it cannot serve.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
                   529: "overloaded_error"}

#: Path suffixes of the Anthropic Messages API.
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


def for_path(err: GatewayError, path: str) -> GatewayError:
    """``err``, answering in the error envelope of the API ``path`` names."""
    if path.split("?", 1)[0].rstrip("/").endswith(ANTHROPIC_PATHS):
        err.anthropic = True
    return err


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
