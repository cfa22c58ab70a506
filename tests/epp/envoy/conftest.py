"""Fixtures for this room (their bodies live in ``tests.support``)."""

from tests.support.epp_gateway import servers  # noqa: F401
from tests.support.picker import idle_servers, pool  # noqa: F401
