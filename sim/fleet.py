"""Many simulated servers in one process, one port each, each with its own engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from sim.config import ServerConfig
from sim.server import SimServer


class Fleet:
    """A set of :class:`~sim.server.SimServer` sharing one event loop.

    Servers can kill and revive each other through ``POST /sim/kill`` / ``/sim/revive`` with a
    ``port``, because a killed server cannot answer on its own port.
    """

    def __init__(self, configs: Iterable[ServerConfig]) -> None:
        self.servers = [SimServer(cfg, fleet=self) for cfg in configs]

    @property
    def ports(self) -> list[int]:
        """Bound ports, in configuration order (valid after :meth:`start`)."""
        return [s.port for s in self.servers]

    @property
    def urls(self) -> list[str]:
        """Base URLs, in configuration order."""
        return [s.url for s in self.servers]

    def server(self, port: int) -> SimServer | None:
        """The server bound to ``port``, if any."""
        for s in self.servers:
            if s.port == port:
                return s
        return None

    async def start(self) -> None:
        """Start every server; on failure the ones already started are stopped again."""
        started: list[SimServer] = []
        try:
            for s in self.servers:
                await s.start()
                started.append(s)
        except BaseException:
            await asyncio.gather(*(s.stop() for s in started), return_exceptions=True)
            raise

    async def stop(self) -> None:
        """Stop every server."""
        await asyncio.gather(*(s.stop() for s in self.servers), return_exceptions=True)

    async def kill(self, port: int, revive_after: float | None = None) -> None:
        """Kill the server on ``port`` (see :meth:`SimServer.kill`)."""
        await self._get(port).kill(revive_after)

    async def revive(self, port: int) -> None:
        """Revive the server on ``port``."""
        await self._get(port).revive()

    def _get(self, port: int) -> SimServer:
        s = self.server(port)
        if s is None:
            raise KeyError(f"no simulated server on port {port}")
        return s


@asynccontextmanager
async def start_fleet(configs: Iterable[ServerConfig]) -> AsyncIterator[Fleet]:
    """Start a fleet for the duration of an ``async with`` block.

    Example::

        cfgs = [ServerConfig(profile=TINY, time_scale=0.1) for _ in range(8)]  # port 0 = free
        async with start_fleet(cfgs) as fleet:
            urls = fleet.urls
    """
    fleet = Fleet(configs)
    await fleet.start()
    try:
        yield fleet
    finally:
        await fleet.stop()
