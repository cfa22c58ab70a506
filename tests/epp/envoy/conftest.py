"""Fixtures for this room (their bodies live in ``tests.support.picker``)."""

from tests.support.picker import idle_servers, pool  # noqa: F401
