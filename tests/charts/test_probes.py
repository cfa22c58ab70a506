"""The charts' probes, run as kubelet runs them, against the real ``epp`` and ``bbr``.

Each chart is rendered with real helm; the Deployment's container is started with its rendered
command, args and environment (see :mod:`tests.charts.pod`) against the fake API server, and
its rendered ``startupProbe``/``livenessProbe``/``readinessProbe`` are executed as written
(gRPC health with the rendered service name and port, TCP, HTTP). The only values set are the
ports, so parallel test runs do not collide.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit import envoy as e
from tests.charts.kubelet import run_probe
from tests.charts.pod import LocalPod
from tests.charts.render import container, one, render
from tests.support import k8s_objects as objects
from tests.support.fake_apiserver import FakeApiServer

UPSTREAM_VALUES = Path(__file__).parent / "upstream" / "inferencepool-v1.5.0.yaml"


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer(bookmark_interval=0.1).start()
    yield server
    server.close()


def epp_sets(*extra: str) -> list[str]:
    return [f"inferenceExtension.extProcPort={e.free_port()}",
            f"inferenceExtension.healthPort={e.free_port()}",
            f"inferenceExtension.metricsPort={e.free_port()}", *extra]


@pytest.mark.parametrize("values", [None, UPSTREAM_VALUES], ids=["ours", "upstream-v1.5.0"])
def test_epp_probes_pass_once_the_pool_has_synced(apiserver: FakeApiServer, tmp_path: Path,
                                                  values: Path | None) -> None:
    objs = render("inferencepool", *epp_sets(), values=[values] if values else None)
    c = container(objs, "epp")
    assert c["readinessProbe"]["grpc"]["service"] == "inference-extension"  # upstream's name
    pod = LocalPod(objs, c, apiserver=apiserver, workdir=tmp_path, pod_name="pool-a-epp-0")
    try:
        pod.wait_probe("startupProbe")
        pod.wait_probe("livenessProbe")
        # No InferencePool yet: alive, not ready.
        ok, seen = pod.probe("readinessProbe")
        assert not ok, seen
        apiserver.apply(one(objs, "InferencePool"))
        apiserver.apply(objects.pod("vllm-0", "127.0.3.1"))
        assert "SERVING" in pod.wait_probe("readinessProbe")
        ok, seen = pod.probe("livenessProbe")
        assert ok, seen
        # kubelet's HTTP probe, on a named port: the metrics endpoint answers.
        ok, seen = run_probe({"httpGet": {"path": "/metrics", "port": "metrics"}}, c)
        assert ok, seen
    finally:
        assert pod.stop() == 0, pod.log_tail()


def test_epp_probes_with_leader_election_follow_the_lease(apiserver: FakeApiServer,
                                                          tmp_path: Path) -> None:
    """Two replicas: both live, only the Lease holder ready."""
    objs = render("inferencepool", *epp_sets("inferenceExtension.replicas=2"))
    c = container(objs, "epp")
    assert "--ha-enable-leader-election" in c["args"]
    assert c["readinessProbe"]["grpc"]["service"] == "readiness"
    apiserver.apply(one(objs, "InferencePool"))
    leader = LocalPod(objs, c, apiserver=apiserver, workdir=tmp_path, pod_name="epp-a")
    follower = None
    try:
        leader.wait_probe("readinessProbe")
        # Same ports are fine for the second process only if they differ: render again.
        objs_b = render("inferencepool", *epp_sets("inferenceExtension.replicas=2"))
        c_b = container(objs_b, "epp")
        (tmp_path / "b").mkdir()
        follower = LocalPod(objs_b, c_b, apiserver=apiserver, workdir=tmp_path / "b",
                            pod_name="epp-b")
        follower.wait_probe("startupProbe")
        follower.wait_probe("livenessProbe")
        ok, seen = follower.probe("readinessProbe")
        assert not ok, seen
        ok, seen = leader.probe("readinessProbe")
        assert ok, seen
        # The leader leaves (SIGTERM hands the Lease back): the follower becomes ready.
        assert leader.stop() == 0, leader.log_tail()
        follower.wait_probe("readinessProbe")
    finally:
        leader.stop()
        if follower is not None:
            assert follower.stop() == 0, follower.log_tail()


def test_bbr_probes_pass_once_configmaps_are_listed(apiserver: FakeApiServer,
                                                    tmp_path: Path) -> None:
    objs = render("body-based-routing", f"bbr.port={e.free_port()}",
                  f"bbr.healthCheckPort={e.free_port()}", f"bbr.metricsPort={e.free_port()}")
    c = container(objs, "bbr")
    pod = LocalPod(objs, c, apiserver=apiserver, workdir=tmp_path, pod_name="bbr-0")
    try:
        for kind in ("livenessProbe", "readinessProbe"):
            assert "SERVING" in pod.wait_probe(kind)
    finally:
        assert pod.stop() == 0, pod.log_tail()


def test_bbr_readiness_waits_for_the_configmaps(apiserver: FakeApiServer,
                                                tmp_path: Path) -> None:
    """While ConfigMaps cannot be listed BBR is alive but not ready."""
    apiserver.forbid("configmaps")
    objs = render("body-based-routing", f"bbr.port={e.free_port()}",
                  f"bbr.healthCheckPort={e.free_port()}", f"bbr.metricsPort={e.free_port()}")
    c = container(objs, "bbr")
    pod = LocalPod(objs, c, apiserver=apiserver, workdir=tmp_path, pod_name="bbr-0")
    try:
        pod.wait_probe("livenessProbe")
        ok, seen = pod.probe("readinessProbe")
        assert not ok, seen
        apiserver.allow("configmaps")
        pod.wait_probe("readinessProbe")
    finally:
        assert pod.stop() == 0, pod.log_tail()


def test_metrics_auth_token_is_what_prometheus_presents(apiserver: FakeApiServer,
                                                       tmp_path: Path) -> None:
    """monitoring.prometheus.auth: the EPP accepts the token of the Secret the ServiceMonitor
    reads, and nothing else."""
    objs = render("inferencepool", *epp_sets(
        "inferenceExtension.monitoring.prometheus.enabled=true"))
    secret = one(objs, "Secret")["metadata"]["name"]
    token = "t0ken-from-the-service-account-controller"
    pod = LocalPod(objs, container(objs, "epp"), apiserver=apiserver, workdir=tmp_path,
                   pod_name="pool-a-epp-0", secrets={secret: {"token": token}})
    endpoint = one(objs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["authorization"]["credentials"] == {"name": secret, "key": "token"}
    path = endpoint["path"]
    service_port = next(p for p in one(objs, "Service")["spec"]["ports"]
                        if p["name"] == endpoint["port"])
    try:
        pod.wait_probe("livenessProbe")
        bearer = {"httpHeaders": [{"name": "Authorization", "value": f"Bearer {token}"}]}
        scrape = {"httpGet": {"path": path, "port": service_port["targetPort"], **bearer}}
        for _ in range(150):  # liveness is the gRPC health port; metrics may come later
            ok, seen = run_probe(scrape, pod.container)
            if "Connection refused" not in seen:
                break
            time.sleep(0.1)
        assert ok, seen
        scrape["httpGet"]["httpHeaders"] = []
        ok, seen = run_probe(scrape, pod.container)
        assert not ok and seen.endswith("401"), seen
    finally:
        assert pod.stop() == 0, pod.log_tail()
