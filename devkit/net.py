"""Loopback port helpers shared by everything in ``devkit`` (and the tests)."""

from __future__ import annotations

import os
import random
import socket
import time
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000
_handed_out: set[int] = set()


def _below_ephemeral() -> range | None:
    """Ports below the kernel's ephemeral range, or None when it cannot be read."""
    try:
        first = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if first - _LOWEST < 1000:
        return None
    return _worker_slice(range(_LOWEST, first))


def _worker_slice(ports: range) -> range:
    """This pytest-xdist worker's share of ``ports`` (all of them outside xdist), so two
    workers never pick the same port in the window before their servers bind it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count <= 1:
        return ports
    index = int(worker[2:]) % count
    size = len(ports) // count
    return range(ports.start + index * size, ports.start + (index + 1) * size)


def free_port() -> int:
    """A TCP port free on loopback right now.

    It is taken below the kernel's ephemeral range: a port the kernel hands out with
    ``bind(0)`` can be given again to any outgoing connection (a scrape, a Valkey client)
    between now and the moment the caller's server binds it, and Envoy then exits with
    "Address already in use". No port is handed out twice by this process.
    """
    ports = _below_ephemeral()
    for _ in range(100 if ports else 0):
        port = random.choice(ports)  # type: ignore[arg-type]
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))  # a ZMQ publisher binds ``tcp://*:port``
        except OSError:
            return False
    return True


def free_port_run(n: int, offset: int = 0) -> int:
    """A base port with ``base .. base + n - 1`` free on every interface and, with
    ``offset``, ``base + offset .. base + offset + n - 1`` too: the layout of several
    servers on one host, each with a second port a fixed offset above its own (KV events,
    ``podDiscoveryConfig.socketPortOffset``)."""
    for _ in range(500):
        base = free_port()
        ports = [base + i for i in range(n)] + ([base + offset + i for i in range(n)]
                                                if offset else [])
        if max(ports) < 65_000 and all(p not in _handed_out or p == base for p in ports) \
                and all(_bindable(p) for p in ports):
            _handed_out.update(ports)
            return base
    raise RuntimeError(f"no run of {n} free ports (offset {offset})")


def wait_for_port(port: int, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
    """Block until something accepts TCP connections on ``host:port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {host}:{port}")
