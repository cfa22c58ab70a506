"""Fixtures for this room (their bodies live in ``tests.support.bbr_gateway``)."""

from tests.support.bbr_gateway import backends, gateway  # noqa: F401
