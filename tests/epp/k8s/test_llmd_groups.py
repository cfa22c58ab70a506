"""InferenceObjective and InferenceModelRewrite in llm-d.ai/v1alpha2 (llm-d-router v0.10) and
in their deprecated group, through the real ``kubernetes`` client against the fake API server:
with both CRDs installed only llm-d.ai is read, as upstream."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.epp.k8s.test_epp_source import eventually, running
from tests.support import k8s_objects as o
from tests.support.fake_apiserver import FakeApiServer

LLMD = "llm-d.ai"


@pytest.fixture
def cluster(apiserver: FakeApiServer) -> Iterator[FakeApiServer]:
    """A pool with one ready pod (llm-d.ai's CRDs not installed until a test says so)."""
    apiserver.apply(o.pool())
    apiserver.apply(o.pod("vllm-0", "10.0.0.1"))
    yield apiserver


def install_llmd(server: FakeApiServer) -> None:
    for plural in ("inferenceobjectives", "inferencemodelrewrites"):
        server.serve(plural, LLMD)


def target(src: Any, model: str) -> str:
    return src.datastore.snapshot.resolve(model, rng=random.Random(0)).target_model


async def test_llm_d_ai_objects_are_read(cluster: FakeApiServer, kube: Any) -> None:
    install_llmd(cluster)
    cluster.apply(o.objective("batch", -1, api=o.LLMD_API))
    cluster.apply(o.rewrite("canary", "llama", "llama-v2", api=o.LLMD_API))
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        await eventually(lambda: "batch" in src.datastore.snapshot.objectives)
        assert src.datastore.snapshot.objectives["batch"].priority == -1
        assert target(src, "llama") == "llama-v2"
        cluster.delete(o.LLMD_API, "InferenceObjective", "batch", o.NS)
        await eventually(lambda: "batch" not in src.datastore.snapshot.objectives)


async def test_with_both_groups_installed_only_llm_d_ai_is_read(cluster: FakeApiServer,
                                                               kube: Any) -> None:
    install_llmd(cluster)
    cluster.apply(o.objective("new", 3, api=o.LLMD_API))
    cluster.apply(o.objective("old", 7))  # deprecated group: ignored
    cluster.apply(o.rewrite("rw", "llama", "from-llm-d", api=o.LLMD_API))
    cluster.apply(o.rewrite("rw", "llama", "from-x-k8s"))
    with capture_logs() as logs:
        async with running(kube) as src:
            await eventually(lambda: src.synced)
            assert set(src.datastore.snapshot.objectives) == {"new"}
            assert target(src, "llama") == "from-llm-d"
            cluster.apply(o.objective("old-2", 1))  # still ignored when it arrives later
            cluster.apply(o.objective("new-2", 1, api=o.LLMD_API))
            await eventually(lambda: "new-2" in src.datastore.snapshot.objectives)
            assert "old-2" not in src.datastore.snapshot.objectives
    warned = [e for e in logs if e["event"].startswith("both ")]
    assert {e["kind"] for e in warned} == {"InferenceObjective", "InferenceModelRewrite"}


async def test_without_llm_d_ai_crds_the_deprecated_group_is_read(cluster: FakeApiServer,
                                                                 kube: Any) -> None:
    cluster.apply(o.objective("old", 7))
    cluster.apply(o.rewrite("rw", "llama", "from-x-k8s"))
    with capture_logs() as logs:
        async with running(kube) as src:
            await eventually(lambda: src.synced)
            assert set(src.datastore.snapshot.objectives) == {"old"}
            assert target(src, "llama") == "from-x-k8s"
    deprecated = [e for e in logs if "is deprecated" in e["event"]]
    assert sorted(e["kind"] for e in deprecated) == ["InferenceModelRewrite",
                                                     "InferenceObjective"]  # once each


async def test_one_kind_in_llm_d_ai_leaves_the_other_in_the_old_group(
        cluster: FakeApiServer, kube: Any) -> None:
    cluster.serve("inferenceobjectives", LLMD)  # rewrites still only in the old group
    cluster.apply(o.objective("new", 3, api=o.LLMD_API))
    cluster.apply(o.objective("old", 7))
    cluster.apply(o.rewrite("rw", "llama", "from-x-k8s"))
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        assert set(src.datastore.snapshot.objectives) == {"new"}
        assert target(src, "llama") == "from-x-k8s"


async def test_installing_the_llm_d_ai_crd_later_switches_to_it(cluster: FakeApiServer,
                                                                kube: Any) -> None:
    cluster.apply(o.objective("old", 7))
    cluster.apply(o.objective("new", 3, api=o.LLMD_API))
    async with running(kube) as src:
        await eventually(lambda: src.synced)
        assert set(src.datastore.snapshot.objectives) == {"old"}
        cluster.serve("inferenceobjectives", LLMD)  # re-listed on the reflector's retry
        await eventually(lambda: set(src.datastore.snapshot.objectives) == {"new"},
                         timeout=10)


async def test_an_rbac_without_llm_d_ai_rules_still_syncs_on_the_old_group(
        cluster: FakeApiServer, kube: Any) -> None:
    """A Role written for GIE v1.5 has no llm-d.ai rule: the API server answers 403 whether
    or not the CRD exists. That counts as "not installed" (logged), not as a stuck sync."""
    for plural in ("inferenceobjectives", "inferencemodelrewrites"):
        cluster.forbid(plural, LLMD)
    cluster.apply(o.objective("old", 7))
    with capture_logs() as logs:
        async with running(kube) as src:
            await eventually(lambda: src.synced)
            assert set(src.datastore.snapshot.objectives) == {"old"}
    assert any(e["event"].startswith("forbidden by RBAC: treating") for e in logs)


async def test_a_forbidden_deprecated_group_still_blocks_the_sync(cluster: FakeApiServer,
                                                                 kube: Any) -> None:
    # Only llm-d.ai gets the lenient reading: a Role missing the group it always needed is
    # a misconfiguration to fix, as before.
    cluster.forbid("inferenceobjectives", "inference.networking.x-k8s.io")
    async with running(kube) as src:
        await asyncio.sleep(0.5)
        assert not src.synced
