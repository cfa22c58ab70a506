"""Fixtures for this room (their bodies live in ``tests.support.views``)."""

from tests.support.views import make_view, raw_pod, raw_pool  # noqa: F401
