"""Fixtures for the Kubernetes tests: a fake API server and a real client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shared.reflector import WatchTiming
from tests.support.fake_apiserver import FakeApiServer, api_client

#: Fast retries so recovery tests finish in well under a second.
FAST = WatchTiming(backoff_initial=0.05, backoff_max=0.2, min_watch_timeout=30,
                   resync_period=0, connect_timeout=2)


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer(bookmark_interval=0.1).start()
    yield server
    server.close()


@pytest.fixture
def kube(apiserver: FakeApiServer) -> Iterator[Any]:
    """A real ``kubernetes.client.ApiClient`` talking to the fake server."""
    client = api_client(apiserver)
    yield client
    client.close()
