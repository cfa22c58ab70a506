"""Fixtures for this room (their bodies live in ``tests.support.flowcontrol``)."""

from tests.support.flowcontrol import gate, make_fc, registry  # noqa: F401
