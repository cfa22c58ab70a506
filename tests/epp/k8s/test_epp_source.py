"""The EPP's Kubernetes source, with the real ``kubernetes`` client against the fake server."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from structlog.testing import capture_logs

from epp.datastore import Datastore
from epp.sources.kubernetes import KubernetesSource
from shared.reflector import WatchTiming
from tests.support import k8s_objects as o
from tests.support.fake_apiserver import FakeApiServer
from tests.support.k8s import FAST


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> None:
    """Wait until ``check()`` is truthy (fails the test with the last value otherwise)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = check()
        if value:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        await asyncio.sleep(0.02)


def keys(ds: Datastore) -> set[str]:
    return {e.key for e in ds.snapshot.endpoints}


@asynccontextmanager
async def running(kube: Any, *, timing: WatchTiming = FAST, pool_name: str | None = "pool-a",
                  **kwargs: Any) -> AsyncIterator[KubernetesSource]:
    ds = Datastore()
    source = KubernetesSource(ds, pool_name, o.NS, api_client=kube, timing=timing, **kwargs)
    source.start()
    try:
        yield source
    finally:
        source.stop()


@pytest.fixture
def cluster(apiserver: FakeApiServer) -> Iterator[FakeApiServer]:
    """A pool with two ready pods."""
    apiserver.apply(o.pool())
    apiserver.apply(o.pod("vllm-0", "10.0.0.1"))
    apiserver.apply(o.pod("vllm-1", "10.0.0.2"))
    yield apiserver


# -- initial sync ---------------------------------------------------------------------------


async def test_pool_pods_become_endpoints_once_listed(cluster: FakeApiServer, kube: Any) -> None:
    async with running(kube) as src:
        await asyncio.wait_for(src.datastore.synced.wait(), 5)
        assert keys(src.datastore) == {"10.0.0.1:8000", "10.0.0.2:8000"}
        assert src.datastore.snapshot.pool is not None
        assert src.datastore.snapshot.pool.name == "pool-a"


async def test_not_synced_until_the_pool_exists(apiserver: FakeApiServer, kube: Any) -> None:
    apiserver.apply(o.pod("vllm-0", "10.0.0.1"))
    async with running(kube) as src:
        await asyncio.sleep(0.3)
        assert not src.synced
        apiserver.apply(o.pool())
        await eventually(lambda: src.synced)
        assert keys(src.datastore) == {"10.0.0.1:8000"}


async def test_list_items_without_kind_are_still_parsed(cluster: FakeApiServer,
                                                        kube: Any) -> None:
    # A real PodList's items carry no kind/apiVersion; the fake server strips them too.
    async with running(kube) as src:
        await asyncio.wait_for(src.datastore.synced.wait(), 5)
        assert {e.pod_name for e in src.datastore.snapshot.endpoints} == {"vllm-0", "vllm-1"}


# -- live changes ---------------------------------------------------------------------------


async def test_pod_added_and_deleted_is_followed(cluster: FakeApiServer, kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.apply(o.pod("vllm-2", "10.0.0.3"))
        await eventually(lambda: "10.0.0.3:8000" in keys(src.datastore))
        cluster.delete("v1", "Pod", "vllm-0", o.NS)
        await eventually(lambda: keys(src.datastore) == {"10.0.0.2:8000", "10.0.0.3:8000"})


async def test_pod_readiness_flip_removes_then_restores_endpoint(cluster: FakeApiServer,
                                                                 kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.apply(o.pod("vllm-0", "10.0.0.1", ready=False))
        await eventually(lambda: keys(src.datastore) == {"10.0.0.2:8000"})
        cluster.apply(o.pod("vllm-0", "10.0.0.1", ready=True))
        await eventually(lambda: keys(src.datastore) == {"10.0.0.1:8000", "10.0.0.2:8000"})


async def test_terminating_pod_leaves_the_pool(cluster: FakeApiServer, kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.apply(o.pod("vllm-1", "10.0.0.2", deleting=True))
        await eventually(lambda: keys(src.datastore) == {"10.0.0.1:8000"})


async def test_pod_relabelled_out_of_the_selector_leaves_the_pool(cluster: FakeApiServer,
                                                                  kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.apply(o.pod("vllm-1", "10.0.0.2", labels={"app": "other"}))
        await eventually(lambda: keys(src.datastore) == {"10.0.0.1:8000"})


async def test_pool_edit_rederives_endpoints(cluster: FakeApiServer, kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.apply(o.pool(ports=(8000, 8001)))
        await eventually(lambda: len(src.datastore.snapshot.endpoints) == 4)
        assert "vllm-0-rank-1" in {e.name for e in src.datastore.snapshot.endpoints}


async def test_active_ports_annotation_narrows_ports(cluster: FakeApiServer, kube: Any) -> None:
    cluster.apply(o.pool(ports=(8000, 8001)))
    async with running(kube) as src:
        await eventually(lambda: len(src.datastore.snapshot.endpoints) == 4)
        cluster.apply(o.pod("vllm-0", "10.0.0.1",
                            annotations={"inference.networking.k8s.io/active-ports": "8001"}))
        await eventually(lambda: keys(src.datastore) == {
            "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001"})


async def test_pool_deleted_serves_no_endpoints(cluster: FakeApiServer, kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.delete(o.POOL_API, "InferencePool", "pool-a", o.NS)
        await eventually(lambda: src.datastore.snapshot.pool is None)
        assert keys(src.datastore) == set()


async def test_objective_and_rewrite_are_followed(cluster: FakeApiServer, kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.apply(o.objective("batch", -1))
        cluster.apply(o.rewrite("canary", "llama", "llama-v2"))
        await eventually(lambda: "batch" in src.datastore.snapshot.objectives
                         and src.datastore.snapshot.rewrites)
        res = src.datastore.snapshot.resolve("llama", rng=random.Random(0),
                                             objective_header="batch")
        assert (res.target_model, res.priority) == ("llama-v2", -1)
        cluster.delete(o.X_API, "InferenceObjective", "batch", o.NS)
        await eventually(lambda: "batch" not in src.datastore.snapshot.objectives)


async def test_objects_of_another_pool_are_ignored(cluster: FakeApiServer, kube: Any) -> None:
    cluster.apply(o.objective("other", 5, pool_name="pool-b"))
    cluster.apply(o.objective("mine", 5))
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        assert set(src.datastore.snapshot.objectives) == {"mine"}


async def test_absent_optional_crd_does_not_block_sync(cluster: FakeApiServer,
                                                       kube: Any) -> None:
    cluster.unserve("inferencemodels")  # legacy CRD not installed
    async with running(kube) as src:
        await asyncio.wait_for(src.datastore.synced.wait(), 5)


# -- bad objects ----------------------------------------------------------------------------


async def test_malformed_object_is_logged_and_skipped(cluster: FakeApiServer,
                                                      kube: Any) -> None:
    cluster.apply(o.objective("broken", "high"))
    cluster.apply(o.objective("fine", 2))
    with capture_logs() as logs:
        async with running(kube) as src:
            await eventually(lambda: src.synced)
            assert set(src.datastore.snapshot.objectives) == {"fine"}
    bad = [e for e in logs if e["event"].startswith("invalid object skipped")]
    assert bad and bad[0]["object"] == "InferenceObjective/broken"
    assert bad[0]["field"] == "spec.priority"


async def test_malformed_update_keeps_the_last_valid_version(cluster: FakeApiServer,
                                                             kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        broken = o.pool(ports=(8000,))
        broken["spec"]["targetPorts"] = []
        with capture_logs() as logs:
            cluster.apply(broken)
            await eventually(lambda: any("keeping its last valid version" in e["event"]
                                         for e in logs))
        assert keys(src.datastore) == {"10.0.0.1:8000", "10.0.0.2:8000"}


# -- connection trouble ---------------------------------------------------------------------


async def test_dropped_watch_resumes_without_losing_an_update(cluster: FakeApiServer,
                                                              kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.sever_watches()
        cluster.apply(o.pod("vllm-2", "10.0.0.3"))  # happens while nobody is watching
        cluster.resume_watches()
        await eventually(lambda: "10.0.0.3:8000" in keys(src.datastore))
        # Resumed from its resourceVersion: no second list was needed.
        assert cluster.count("GET", "pods", watch=False) == 1


async def test_gone_410_relists_without_losing_an_update(cluster: FakeApiServer,
                                                         kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.sever_watches()
        cluster.delete("v1", "Pod", "vllm-1", o.NS)
        cluster.compact()  # the resume point is gone: watches from it get 410
        cluster.resume_watches()
        await eventually(lambda: keys(src.datastore) == {"10.0.0.1:8000"})
        assert cluster.count("GET", "pods", watch=False) == 2


async def test_bookmarks_keep_an_idle_watch_resumable(cluster: FakeApiServer,
                                                      kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.bump(50)  # writes elsewhere move the resourceVersion on
        await asyncio.sleep(0.5)  # several bookmark intervals
        cluster.sever_watches()
        cluster.compact()
        cluster.resume_watches()
        cluster.apply(o.pod("vllm-2", "10.0.0.3"))
        await eventually(lambda: "10.0.0.3:8000" in keys(src.datastore))
        assert cluster.count("GET", "pods", watch=False) == 1


async def test_server_ended_watch_is_reopened(cluster: FakeApiServer, kube: Any) -> None:
    timing = dataclasses.replace(FAST, min_watch_timeout=0.5)  # server ends watches at 1 s
    async with running(kube, timing=timing) as src:
        await eventually(lambda: src.synced)
        await eventually(lambda: cluster.count("GET", "pods", watch=True) >= 2, timeout=4)
        cluster.apply(o.pod("vllm-2", "10.0.0.3"))
        await eventually(lambda: "10.0.0.3:8000" in keys(src.datastore))
        assert cluster.count("GET", "pods", watch=False) == 1


async def test_periodic_resync_relists(cluster: FakeApiServer, kube: Any) -> None:
    timing = dataclasses.replace(FAST, resync_period=0.3)
    async with running(kube, timing=timing) as src:
        await eventually(lambda: src.synced)
        await eventually(lambda: cluster.count("GET", "pods", watch=False) >= 2, timeout=4)


async def test_forbidden_is_logged_clearly_and_retried(cluster: FakeApiServer,
                                                       kube: Any) -> None:
    cluster.forbid("pods")
    with capture_logs() as logs:
        async with running(kube) as src:
            await eventually(lambda: any(e["event"].startswith("forbidden by RBAC")
                                         for e in logs))
            assert not src.synced
            err = next(e for e in logs if e["event"].startswith("forbidden by RBAC"))
            assert err["log_level"] == "error"
            assert err["resource"] == "pods"
            assert 'cannot list resource "pods"' in err["message"]
            cluster.allow("pods")
            await eventually(lambda: src.synced)


async def test_api_server_errors_do_not_lose_the_served_state(cluster: FakeApiServer,
                                                              kube: Any) -> None:
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        cluster.forbid("pods")
        cluster.drop_watches()
        await asyncio.sleep(0.3)
        assert keys(src.datastore) == {"10.0.0.1:8000", "10.0.0.2:8000"}


# -- standalone mode ------------------------------------------------------------------------


async def test_standalone_selects_pods_by_label_without_a_pool(apiserver: FakeApiServer,
                                                               kube: Any) -> None:
    apiserver.apply(o.pod("a", "10.0.0.1", labels={"app": "vllm", "tier": "gpu"}))
    apiserver.apply(o.pod("b", "10.0.0.2", labels={"app": "vllm", "tier": "cpu"}))
    async with running(kube, pool_name=None, endpoint_selector="app=vllm,tier=gpu",
                       target_ports="8000,8001") as src:
        await asyncio.wait_for(src.datastore.synced.wait(), 5)
        assert keys(src.datastore) == {"10.0.0.1:8000", "10.0.0.1:8001"}
        assert apiserver.count("GET", "inferencepools") == 0
        labels = {q.get("labelSelector") for m, p, q in apiserver.requests if "pods" in p}
        assert labels == {"app=vllm,tier=gpu"}


@pytest.mark.parametrize(("selector", "ports", "message"), [
    ("app!=vllm", "8000", "not a key=value label requirement"),
    ("app in (a,b)", "8000", "not a key=value label requirement"),
    ("app=vllm", "80x", "must be a comma list of ports"),
    ("app=vllm", "8000,8000", "listed twice"),
    ("app=vllm", None, "go together"),
])
def test_standalone_rejects_bad_flags(selector: str, ports: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KubernetesSource(Datastore(), None, o.NS, endpoint_selector=selector,
                         target_ports=ports, api_client=object())


def test_unknown_pool_group_is_rejected() -> None:
    with pytest.raises(ValueError, match="--pool-group must be"):
        KubernetesSource(Datastore(), "p", o.NS, "example.com", api_client=object())


async def test_legacy_pool_group_watches_v1alpha2_pools(apiserver: FakeApiServer,
                                                        kube: Any) -> None:
    apiserver.apply({
        "apiVersion": o.X_API, "kind": "InferencePool",
        "metadata": {"name": "old", "namespace": o.NS},
        "spec": {"selector": {"app": "vllm"}, "targetPortNumber": 8000,
                 "extensionRef": {"name": "old-epp"}},
    })
    apiserver.apply(o.pod("vllm-0", "10.0.0.1"))
    async with running(kube, pool_name="old",
                       pool_group="inference.networking.x-k8s.io") as src:
        await asyncio.wait_for(src.datastore.synced.wait(), 5)
        assert keys(src.datastore) == {"10.0.0.1:8000"}


async def test_run_stops_watching_when_cancelled(cluster: FakeApiServer, kube: Any) -> None:
    src = KubernetesSource(Datastore(), "pool-a", o.NS, api_client=kube, timing=FAST)
    task = asyncio.create_task(src.run())
    await eventually(lambda: src.synced)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    cluster.apply(o.pod("vllm-2", "10.0.0.3"))
    await asyncio.sleep(0.3)
    assert "10.0.0.3:8000" not in keys(src.datastore)


async def test_run_returns_once_its_watch_threads_have_ended(cluster: FakeApiServer,
                                                            kube: Any) -> None:
    """Cancelled while every reflector waits on a slow list, run() returns only when their
    threads are done: none hands a delta to an event loop that is closing (the EPP's
    shutdown)."""
    cluster.list_delay = 0.5
    src = KubernetesSource(Datastore(), "pool-a", o.NS, api_client=kube, timing=FAST)
    task = asyncio.create_task(src.run())
    await eventually(lambda: cluster.count("GET", "pods", watch=False) >= 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not any(r._thread.is_alive() for r in src._reflectors)
