"""A real Envoy routing by ``x-gateway-model-name`` in front of echo backends, with BBR."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from bbr.basemodels import StaticBaseModels
from bbr.models import ModelListing
from bbr.plugins import build
from bbr.router import BodyRouter
from devkit import envoy as e
from devkit.topology import Pool, Topology
from shared.extproc import ExtProcServicer
from tests.support.processes import BackgroundLoop, EchoBackend, InProcessService

UNICODE_MODEL = "modèle-日本語"
MAX_BODY = 10 * 1024 * 1024


@dataclass
class Gateway:
    mode: str
    envoy: e.Envoy
    port: int
    backends: dict[str, EchoBackend]

    def url(self, path: str = "/v1/completions") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture(scope="module")
def backends(bg: BackgroundLoop) -> Iterator[dict[str, EchoBackend]]:
    names = ("a", "b", "default")
    servers = {n: bg.run(EchoBackend(n).start()) for n in names}
    yield servers
    for s in servers.values():
        bg.run(s.stop())


def gateway_config(mode: str, bbr_port: int, backends: dict[str, EchoBackend], admin: int,
                   listen: int, *, tls: bool = False, not_found: str | None = None,
                   ) -> dict[str, Any]:
    """BBR, then a route per model header to echo backends ``a`` and ``b``, else ``default``
    (with ``not_found``: no ``default`` route, the gateway's 404 instead)."""
    models = {"a": ["a"], "b": ["b", UNICODE_MODEL], "default": []}
    return Topology(listen=listen, admin=admin, bbr_port=bbr_port, mode=mode, tls=tls, pools=[
        Pool(n, models=models[n], cluster=n, endpoints=[("127.0.0.1", s.port)])
        for n, s in backends.items() if not_found is None or models[n]],
        not_found=not_found).bootstrap()


def start_gateway(bg: BackgroundLoop, mode: str, backends: dict[str, EchoBackend],
                  base_models: StaticBaseModels | None = None, *, tls: bool = False,
                  models_endpoint: bool = True, require_model: bool = True,
                  not_found: str | None = None) -> tuple[Gateway, InProcessService]:
    base_models = base_models or StaticBaseModels()
    listing = ModelListing(base_models, created=1700000000) if models_endpoint else None
    router = BodyRouter(build([], base_models), listing, require_model=require_model)
    svc = InProcessService(bg, ExtProcServicer(router.exchange, max_body=MAX_BODY),
                           secure=tls).start()
    admin, listen = e.free_port(), e.free_port()
    envoy = e.Envoy(gateway_config(mode, svc.port, backends, admin, listen, tls=tls,
                                   not_found=not_found), admin_port=admin).start()
    return Gateway(mode, envoy, listen, backends), svc


BASE_MODELS = StaticBaseModels({"food-review": "a", "a": "a"})


@pytest.fixture(scope="module", params=["BUFFERED", "FULL_DUPLEX_STREAMED"])
def gateway(request: pytest.FixtureRequest, bg: BackgroundLoop,
            backends: dict[str, EchoBackend]) -> Iterator[Gateway]:
    gw, svc = start_gateway(bg, request.param, backends, BASE_MODELS)
    yield gw
    gw.envoy.stop()
    svc.stop()
