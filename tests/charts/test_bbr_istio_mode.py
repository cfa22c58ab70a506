"""The BBR chart's Istio EnvoyFilter, as rendered (FULL_DUPLEX_STREAMED both ways, response
headers and trailers sent, mode override allowed), in a real Envoy in front of the ``bbr``
the chart starts: requests are routed by model with the body intact, and responses (plain
and server-sent events) come back unchanged."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devkit import envoy as e
from tests.charts.pod import LocalPod
from tests.charts.render import container, one, render
from tests.support.processes import BackgroundLoop, EchoBackend

pytestmark = pytest.mark.envoy


@pytest.fixture
def backends(bg: BackgroundLoop) -> Iterator[dict[str, EchoBackend]]:
    started = {n: bg.run(EchoBackend(n).start()) for n in ("a", "default")}
    yield started
    for b in started.values():
        bg.run(b.stop())


def rendered_filter(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rendered ext_proc filter, pointed at the local cluster ``bbr``."""
    (patch,) = one(objs, "EnvoyFilter")["spec"]["configPatches"]
    value = copy.deepcopy(patch["patch"]["value"])
    value["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] = "bbr"
    return {"name": value["name"], "typed_config": value["typed_config"]}


def test_rendered_istio_filter_routes_through_the_rendered_bbr(
        backends: dict[str, EchoBackend], tmp_path: Path) -> None:
    objs = render("body-based-routing", "provider.name=istio", f"bbr.port={e.free_port()}",
                  f"bbr.healthCheckPort={e.free_port()}", f"bbr.metricsPort={e.free_port()}",
                  "bbr.baseModelsFromConfigMaps=false", release="bbr")
    ext_proc = rendered_filter(objs)
    mode = ext_proc["typed_config"]["processing_mode"]
    assert mode["request_body_mode"] == mode["response_body_mode"] == "FULL_DUPLEX_STREAMED"
    c = container(objs, "bbr")
    pod = LocalPod(objs, c, apiserver=None, workdir=tmp_path, pod_name="bbr-0")
    admin, listen = e.free_port(), e.free_port()
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    cfg = e.bootstrap(admin, [e.listener(listen, [
        e.route("a", header=("x-gateway-model-name", "a")), e.route("default")], [ext_proc])], [
        e.grpc_cluster("bbr", port, tls=True),
        e.static_cluster("a", [("127.0.0.1", backends["a"].port)]),
        e.static_cluster("default", [("127.0.0.1", backends["default"].port)])])
    try:
        pod.wait_probe("readinessProbe")
        with e.Envoy(cfg, admin_port=admin):
            body = b'{"model": "a", "prompt": "' + b"x" * 200_000 + b'"}'
            r = httpx.post(f"http://127.0.0.1:{listen}/v1/completions", content=body,
                           headers={"content-type": "application/json"}, timeout=30)
            assert r.status_code == 200, r.text
            seen = r.json()
            assert seen["backend"] == "a"
            assert seen["sha256"] == hashlib.sha256(body).hexdigest()
            assert r.headers["x-backend"] == "a"

            r = httpx.post(f"http://127.0.0.1:{listen}/sse?n=4&delay=0",
                           content=b'{"model": "a", "stream": true}',
                           headers={"content-type": "application/json"}, timeout=30)
            assert r.status_code == 200
            assert r.headers["x-backend"] == "a"
            assert r.text.count("data:") == 5, r.text  # 4 events and [DONE]

            r = httpx.post(f"http://127.0.0.1:{listen}/v1/completions",
                           content=b'{"prompt": "no model"}', timeout=30)
            # bbr --require-model (default): the EPP's 400, not the default route
            assert r.status_code == 400 and r.json()["error"]["code"] == "missing_model"
            r = httpx.post(f"http://127.0.0.1:{listen}/v1/completions",
                           content=b'{"model": "b", "prompt": "x"}', timeout=30)
            assert r.json()["backend"] == "default"
    finally:
        assert pod.stop() == 0, pod.log_tail()
