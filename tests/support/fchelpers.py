"""Helpers for the flow-control tests: a saturation gate the test opens and closes."""

from __future__ import annotations

from epp.flowcontrol import FlowController


class Gate:
    """A saturation signal under the test's control: ``value`` is what the detector says."""

    def __init__(self, value: float = 1.0) -> None:
        self.value = value

    def __call__(self) -> float:
        return self.value


def release(fc: FlowController, gate: Gate, n: int = 1) -> int:
    """Open the gate for exactly ``n`` dispatch cycles (no await in between); returns how
    many requests were released."""
    gate.value, closed = 0.0, gate.value
    try:
        return sum(fc.dispatch_cycle() for _ in range(n))
    finally:
        gate.value = closed
