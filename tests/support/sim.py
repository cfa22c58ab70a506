"""Fixtures: simulated servers on free loopback ports in the test's own event loop."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import httpx
import pytest

from sim.config import ServerConfig
from sim.fleet import Fleet, start_fleet
from sim.profiles import TINY

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def tiny(**changes: object) -> ServerConfig:
    """A fast test server on a free port; keyword arguments override profile fields."""
    profile_fields = {f.name for f in dataclasses.fields(TINY)} - {"name"}
    prof = {k: v for k, v in changes.items() if k in profile_fields}
    rest = {k: v for k, v in changes.items() if k not in profile_fields}
    return ServerConfig(profile=TINY.with_overrides(prof), **rest)  # type: ignore[arg-type]


FleetFactory = Callable[..., AbstractAsyncContextManager[Fleet]]


@pytest.fixture
def fleet_of() -> FleetFactory:
    """``async with fleet_of(cfg, ...) as fleet`` starts servers and stops them afterwards."""
    return lambda *cfgs: start_fleet(list(cfgs))


@pytest.fixture
async def server() -> AsyncIterator[tuple[Fleet, httpx.AsyncClient]]:
    """One tiny server and a client pointed at it."""
    async with start_fleet([tiny()]) as fleet, httpx.AsyncClient(
        base_url=fleet.urls[0], timeout=5.0
    ) as client:
        yield fleet, client
