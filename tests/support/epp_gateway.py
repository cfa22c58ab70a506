"""One EPP process behind a real Envoy over in-process model servers, started per test with
its own config (the plugin tests of tests/epp/envoy), and the three servers it fronts."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from devkit import envoy as e
from devkit.manifests import pool_manifests, write_yaml
from tests.support.picker import start_servers
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer, pool_gateway_config


class EppGateway:
    """Envoy in front of one EPP started with ``epp_args``; pod ``i`` gets ``labels[i]``,
    ``extra`` objects (objectives, rewrites) go into the manifests beside the pool."""

    def __init__(self, bg: BackgroundLoop, tmp: Path, servers: list[FakeModelServer],
                 *epp_args: str, labels: list[dict[str, str]] | None = None,
                 extra: list[dict[str, Any]] | None = None) -> None:
        docs = pool_manifests("pool", [(s.name, s.host) for s in servers], servers[0].port,
                              extra)
        for doc, pod_labels in zip(docs[1:], labels or [], strict=False):
            doc["metadata"]["labels"].update(pod_labels)
        manifests = tmp / "pool.yaml"
        write_yaml(manifests, docs)
        self.epp = EppProcess(manifests, *epp_args, log_path=tmp / "epp.log").wait_serving()
        admin, self.port = e.free_port(), e.free_port()
        self.envoy = e.Envoy(pool_gateway_config(self.epp.port, admin, self.port,
                                                 endpoints=[s.key for s in servers]),
                             admin_port=admin, workdir=tmp / "envoy").start()

    def complete(self, prompt: str, headers: dict[str, str] | None = None) -> httpx.Response:
        """One non-streaming completion of one token through Envoy."""
        body = orjson.dumps({"model": "base-model", "prompt": prompt, "max_tokens": 1})
        return httpx.post(f"http://127.0.0.1:{self.port}/v1/completions", content=body,
                          headers=headers or {}, timeout=10)

    def served(self, n: int, headers: dict[str, str] | None = None) -> Counter[str]:
        """``n`` distinct completions (each must succeed); how many each pod served."""
        out: Counter[str] = Counter()
        for i in range(n):
            r = self.complete(f"request {i} " * 8, headers)
            assert r.status_code == 200, r.text
            out[r.headers["x-inference-pod"]] += 1
        return out

    def debug_pool(self) -> dict[str, dict[str, Any]]:
        """The EPP's ``/debug/pool`` endpoints by address."""
        r = httpx.get(f"http://127.0.0.1:{self.epp.metrics}/debug/pool", timeout=5)
        return {ep["address"]: ep for ep in r.json()["endpoints"]}

    def wait_scraped(self, key: str, field: str, value: Any, timeout: float = 10) -> None:
        """Until the EPP's view of endpoint ``key`` shows ``field == value``."""
        deadline = time.monotonic() + timeout
        while self.debug_pool()[key][field] != value:
            assert time.monotonic() < deadline, f"{key} never showed {field}={value}"
            time.sleep(0.05)

    def stop(self) -> None:
        self.envoy.stop()
        self.epp.stop()


@pytest.fixture
def servers(bg: BackgroundLoop) -> Iterator[list[FakeModelServer]]:
    """Three fresh model servers (pod-0..2) on one port."""
    started = start_servers(bg, 3)
    yield started
    for s in started:
        bg.run(s.stop())
