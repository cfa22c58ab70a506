"""The sidecar's allow-list fed by the EPP's Kubernetes source (real client, fake API server)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from epp.datastore import Datastore
from epp.sources.kubernetes import KubernetesSource
from modelserver.pd import ROLE_LABEL
from sidecar.allowlist import PoolPrefillers
from tests.support import k8s_objects as o
from tests.support.fake_apiserver import FakeApiServer, api_client
from tests.support.k8s import FAST


def role(r: str) -> dict[str, str]:
    return {"app": "vllm", ROLE_LABEL: r}


@pytest.fixture
def cluster() -> Iterator[FakeApiServer]:
    server = FakeApiServer(bookmark_interval=0.1).start()
    server.apply(o.pool())
    server.apply(o.pod("prefill-0", "10.0.0.1", labels=role("prefill")))
    server.apply(o.pod("decode-0", "10.0.0.2", labels=role("decode")))
    server.apply(o.pod("other", "10.0.0.3", labels={"app": "other", ROLE_LABEL: "prefill"}))
    yield server
    server.close()


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.02)


async def test_allow_list_is_the_pools_prefill_pods_and_follows_them(
    cluster: FakeApiServer,
) -> None:
    kube = api_client(cluster)
    datastore = Datastore()
    source = KubernetesSource(datastore, "pool-a", o.NS, api_client=kube, timing=FAST)
    allow = PoolPrefillers(datastore)
    source.start()
    try:
        await eventually(lambda: source.synced)
        assert allow.allowed == {"10.0.0.1:8000"}  # not the decode pod, not another pool's
        assert not allow.allows("10.0.0.3:8000")
        cluster.apply(o.pod("prefill-1", "10.0.0.4", labels=role("prefill-decode")))
        await eventually(lambda: allow.allows("10.0.0.4:8000"))
        cluster.apply(o.pod("prefill-0", "10.0.0.1", labels=role("prefill"), ready=False))
        await eventually(lambda: not allow.allows("10.0.0.1:8000"))
        assert allow.allowed == {"10.0.0.4:8000"}
    finally:
        source.stop()
        kube.close()
