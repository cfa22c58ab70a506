"""``--manifests`` with ``--endpoint-selector`` (upstream's standalone mode: a label selector
instead of an InferencePool), and pods of other engines without the engine label, through the
real ``epp`` and a real Envoy."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from devkit import envoy as e
from devkit.manifests import write_yaml
from tests.support.processes import BackgroundLoop, EppProcess, FakeModelServer, pool_gateway_config

pytestmark = pytest.mark.envoy


class SglangServer(FakeModelServer):
    """The fake server, its ``/metrics`` in SGLang's names."""

    def metrics_text(self) -> str:
        labels = f'model_name="{self.model}"'
        return (f"sglang:num_queue_reqs{{{labels}}} {self.waiting}\n"
                f"sglang:num_running_reqs{{{labels}}} {self.running}\n"
                f"sglang:token_usage{{{labels}}} {self.kv}\n")


def pod(name: str, ip: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "status": {"podIP": ip}}


@pytest.fixture
def servers(bg: BackgroundLoop) -> Iterator[list[FakeModelServer]]:
    port = e.free_port()
    started = [bg.run(FakeModelServer("vllm-0", "127.0.5.1", port).start()),
               bg.run(SglangServer("sglang-1", "127.0.5.2", port).start()),
               bg.run(FakeModelServer("other-2", "127.0.5.3", port).start())]
    yield started
    for s in started:
        bg.run(s.stop())


def manifests_without_a_pool(tmp: Path, servers: list[FakeModelServer]) -> Path:
    """Two pods labelled ``app: llm`` (one vLLM, one SGLang, neither with an engine label),
    one labelled ``app: other``, and an InferencePool selecting only the third: standalone
    mode ignores it."""
    path = tmp / "pods.yaml"
    write_yaml(path, [
        pod("vllm-0", servers[0].host, {"app": "llm"}),
        pod("sglang-1", servers[1].host, {"app": "llm"}),
        pod("other-2", servers[2].host, {"app": "other"}),
        {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
         "metadata": {"name": "elsewhere", "namespace": "default"},
         "spec": {"selector": {"matchLabels": {"app": "other"}},
                  "targetPorts": [{"number": servers[0].port}],
                  "endpointPickerRef": {"name": "x", "port": {"number": 9002}}}},
    ])
    return path


def debug_pool(epp: EppProcess) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"http://127.0.0.1:{epp.metrics}/debug/pool", timeout=5)
    return {ep["address"]: ep for ep in r.json()["endpoints"]}


def test_endpoint_selector_with_manifests_serves_the_selected_pods(
        servers: list[FakeModelServer], tmp_path: Path) -> None:
    # The SGLang pod is the idle one: once its metrics are read, it is the pick.
    servers[0].waiting, servers[1].waiting = 6, 0
    servers[1].running = 3
    epp = EppProcess(manifests_without_a_pool(tmp_path, servers), "--endpoint-selector",
                     "app=llm", "--endpoint-target-ports", str(servers[0].port),
                     log_path=tmp_path / "epp.log").wait_serving()
    admin, listen = e.free_port(), e.free_port()
    try:
        # Both selected pods, and only they, are endpoints; the SGLang one is healthy and its
        # queue was read from SGLang's metric names.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pool = debug_pool(epp)
            if all(ep["healthy"] and ep["age_seconds"] is not None for ep in pool.values()):
                break
            time.sleep(0.05)
        assert set(pool) == {servers[0].key, servers[1].key}
        assert pool[servers[1].key]["healthy"] and pool[servers[1].key]["running"] == 3
        gateway = pool_gateway_config(epp.port, admin, listen,
                                      endpoints=[s.key for s in servers])
        served: Counter[str] = Counter()
        with e.Envoy(gateway, admin_port=admin, workdir=tmp_path / "envoy"), \
                httpx.Client(timeout=10) as client:
            for i in range(30):
                r = client.post(f"http://127.0.0.1:{listen}/v1/completions",
                                content=orjson.dumps({"model": "m", "prompt": f"hi {i}"}))
                assert r.status_code == 200, r.text
                served[r.json()["served_by"]] += 1
        assert set(served) <= {"vllm-0", "sglang-1"}
        assert served["sglang-1"] > served["vllm-0"]  # an unlabelled SGLang pod is routable
    finally:
        epp.stop()


def test_standalone_pool_takes_the_pool_name_flag(
        servers: list[FakeModelServer], tmp_path: Path) -> None:
    epp = EppProcess(manifests_without_a_pool(tmp_path, servers), "--endpoint-selector",
                     "app=other", "--endpoint-target-ports", str(servers[0].port),
                     "--pool-name", "mine", log_path=tmp_path / "epp.log").wait_serving()
    try:
        r = httpx.get(f"http://127.0.0.1:{epp.metrics}/debug/pool", timeout=5).json()
        assert r["pool"] == "mine"
        assert [ep["address"] for ep in r["endpoints"]] == [servers[2].key]
    finally:
        epp.stop()


@pytest.mark.parametrize(("args", "message"), [
    (["--endpoint-selector", "app", "--endpoint-target-ports", "8000"],
     "--endpoint-selector: 'app' is not a key=value label requirement"),
    (["--endpoint-selector", "app=x", "--endpoint-target-ports", "80,80"],
     "--endpoint-target-ports: a port is listed twice"),
])
def test_bad_standalone_flags_with_manifests_exit_with_one_line(
        tmp_path: Path, args: list[str], message: str) -> None:
    path = tmp_path / "pods.yaml"
    write_yaml(path, [pod("p", "127.0.5.9", {"app": "x"})])
    proc = subprocess.run([sys.executable, "-m", "epp.main", "--manifests", str(path), *args],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
