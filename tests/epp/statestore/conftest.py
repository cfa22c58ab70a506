"""Real Valkey servers for the state-store tests (``valkey-server`` from the wheel)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import valkey

from devkit.valkey import ValkeyServer
from epp.statestore import ValkeyStateStore, parse_store_url


@pytest.fixture(scope="session")
def shared_valkey() -> Iterator[ValkeyServer]:
    """One server for the tests that only read and write (flushed before each test)."""
    with ValkeyServer() as server:
        yield server


@pytest.fixture
def store_url(shared_valkey: ValkeyServer) -> str:
    """URL of the shared server, emptied for this test."""
    with valkey.Valkey(port=shared_valkey.port) as raw:
        raw.flushall()
    return shared_valkey.url


@pytest.fixture
def fresh_valkey() -> Iterator[ValkeyServer]:
    """A private server this test may kill and restart."""
    with ValkeyServer() as server:
        yield server


@pytest.fixture
async def replicas() -> AsyncIterator[Callable[..., Awaitable[ValkeyStateStore]]]:
    """``await replicas(url, name, **kw)``: a started store, closed after the test."""
    started: list[ValkeyStateStore] = []

    async def make(url: str, name: str, **kwargs: float) -> ValkeyStateStore:
        store = ValkeyStateStore(parse_store_url(url), pool="pool-a", replica=name, **kwargs)
        await store.start()
        started.append(store)
        return store

    yield make
    for store in started:
        await store.close()


Eventually = Callable[[Callable[[], bool], str], Awaitable[None]]


async def _eventually(check: Callable[[], bool], what: str, within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
def eventually() -> Eventually:
    """``await eventually(check, what)``: wait until ``check()`` holds (no timing asserted:
    the deadline only bounds a failure), else fail naming ``what``."""
    return _eventually
