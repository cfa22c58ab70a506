"""Fixtures shared by every test: a background loop and real backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import BackgroundLoop


@pytest.fixture(scope="session")
def bg() -> Iterator[BackgroundLoop]:
    """One background event loop for servers that sync tests talk to."""
    loop = BackgroundLoop()
    yield loop
    loop.close()
