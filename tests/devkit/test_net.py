"""devkit.net.free_port stays out of the ports an outgoing connection can be given."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from devkit.net import free_port, free_port_run


def test_free_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not ranges.exists():
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range: not Linux, bind(0) is used")
    first_ephemeral = int(ranges.read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(p < first_ephemeral for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


def test_a_port_run_is_free_on_every_interface_with_its_offset_run() -> None:
    base = free_port_run(4, 1000)
    taken = [base + i for i in range(4)] + [base + 1000 + i for i in range(4)]
    socks = []
    try:
        for port in taken:  # every one binds on all interfaces, as a ZMQ publisher does
            s = socket.socket()
            socks.append(s)
            s.bind(("0.0.0.0", port))
        assert not set(taken) & {free_port() for _ in range(50)}  # never handed out again
    finally:
        for s in socks:
            s.close()


def test_each_xdist_worker_draws_from_its_own_slice_of_the_range(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from devkit.net import _worker_slice

    ports = range(10000, 30000)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert _worker_slice(ports) == ports
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    slices = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        slices.append(set(_worker_slice(ports)))
    assert slices[0].isdisjoint(slices[1])
    assert len(slices[0]) == len(slices[1]) == 10000
