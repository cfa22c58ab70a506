"""Fixtures for this room (their bodies live in ``tests.support.two_pools``)."""

from tests.support.two_pools import two_pools  # noqa: F401
