"""Fixtures for the flow controller: a saturation gate, and metrics on a private registry
so tests can read exact values."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from epp.flowcontrol import FlowControlConfig, FlowController, FlowControlMetrics
from tests.support.fchelpers import Gate


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def gate() -> Gate:
    """Saturated until the test says otherwise."""
    return Gate(1.0)


MakeFC = Callable[..., FlowController]


@pytest.fixture
async def make_fc(registry: CollectorRegistry, gate: Gate) -> AsyncIterator[MakeFC]:
    """Build controllers over ``gate``; each is closed at the end of the test."""
    made: list[FlowController] = []

    def make(config: FlowControlConfig | None = None, **kw: object) -> FlowController:
        fc = FlowController(config or FlowControlConfig(), kw.pop("saturation", gate),  # type: ignore[arg-type]
                            pool_name="pool-a", metrics=FlowControlMetrics(registry),
                            **kw)  # type: ignore[arg-type]
        made.append(fc)
        return fc

    yield make
    for fc in made:
        await fc.aclose()
