"""Fixtures for this room (their bodies live in ``tests.support.sim``)."""

from tests.support.sim import fleet_of, server  # noqa: F401
