"""Fixtures for the reliability tests: a two-pool gateway with a canary outside both pools."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit import envoy as e
from devkit.reliability.gateway import Gateway, PoolDef, start_gateway
from tests.support.processes import BackgroundLoop, EchoBackend, FakeModelServer

LLAMA = ["llama-8b", "llama-chat"]
QWEN = ["qwen-7b"]


@dataclass
class TwoPools:
    """The gateway, each pool's servers and two canaries no request may ever reach."""

    gateway: Gateway
    servers: dict[str, list[FakeModelServer]]
    canary_http: EchoBackend
    canary_pod: FakeModelServer

    def pool_of(self, server_name: str) -> str:
        """The pool of a server; ``"outside"`` for the canary (in no EPP's pool)."""
        return next((p for p, ss in self.servers.items()
                     if any(s.name == server_name for s in ss)), "outside")

    def reset(self) -> None:
        for ss in self.servers.values():
            for s in ss:
                s.requests.clear()


def start_two_pools(bg: BackgroundLoop, tmp: Path, mode: str) -> TwoPools:
    port = e.free_port()
    servers = {
        "llama": [bg.run(FakeModelServer(f"llama-{i}", f"127.0.20.{i + 1}", port).start())
                  for i in range(2)],
        "qwen": [bg.run(FakeModelServer(f"qwen-{i}", f"127.0.21.{i + 1}", port).start())
                 for i in range(2)],
    }
    for s in servers["llama"]:
        s.model = LLAMA[0]
    for s in servers["qwen"]:
        s.model = QWEN[0]
    canary_http = bg.run(EchoBackend("canary").start())
    canary_pod = bg.run(FakeModelServer("canary-pod", "127.0.30.1", port).start())
    # The canary pod is in both pools' Envoy clusters (Envoy can route to it) but in no
    # EPP's pool: if any request reached it, something other than the EPP's pick steered it.
    pools = [PoolDef("llama", LLAMA, [(s.name, s.host) for s in servers["llama"]], port,
                     decoys=[canary_pod.host]),
             PoolDef("qwen", QWEN, [(s.name, s.host) for s in servers["qwen"]], port,
                     decoys=[canary_pod.host])]
    gw = start_gateway(tmp, pools, mode=mode)
    return TwoPools(gw, servers, canary_http, canary_pod)


def stop_two_pools(bg: BackgroundLoop, tp: TwoPools) -> None:
    tp.gateway.stop()
    for s in [*tp.servers["llama"], *tp.servers["qwen"], tp.canary_pod]:
        bg.run(s.stop())
    bg.run(tp.canary_http.stop())


@pytest.fixture(scope="module", params=["BUFFERED", "FULL_DUPLEX_STREAMED"])
def two_pools(request: pytest.FixtureRequest, bg: BackgroundLoop,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoPools]:
    tp = start_two_pools(bg, tmp_path_factory.mktemp(f"two-pools-{request.param}"),
                         request.param)
    yield tp
    stop_two_pools(bg, tp)
