"""BBR's base-model mapping from labelled ConfigMaps, with the real client and fake server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from bbr.basemodels import StaticBaseModels
from bbr.configmaps import ConfigMapWatch, start_configmap_watch
from tests.support import k8s_objects as o
from tests.support.fake_apiserver import FakeApiServer
from tests.support.k8s import FAST

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def eventually(check: Callable[[], Any], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.02)


@pytest.fixture
def models() -> StaticBaseModels:
    return StaticBaseModels()


@pytest.fixture
def watch(apiserver: FakeApiServer, kube: Any,
          models: StaticBaseModels) -> Iterator[Callable[..., ConfigMapWatch]]:
    handles: list[ConfigMapWatch] = []

    def start(namespace: str | None = o.NS) -> ConfigMapWatch:
        h = start_configmap_watch(models, namespace, kube, timing=FAST)
        handles.append(h)
        assert h.wait_synced(5)
        return h

    yield start
    for h in handles:
        h.stop()


def test_labelled_configmap_maps_adapters_and_base(apiserver: FakeApiServer,
                                                   models: StaticBaseModels,
                                                   watch: Callable[..., ConfigMapWatch]) -> None:
    apiserver.apply(o.configmap("llama", {"baseModel": LLAMA,
                                          "adapters": "- food-review\n- sql-lora\n"}))
    watch()
    assert models.base_of("food-review") == LLAMA
    assert models.base_of("sql-lora") == LLAMA
    assert models.base_of(LLAMA) == LLAMA
    assert models.base_of("unknown") is None


def test_unlabelled_configmap_is_ignored(apiserver: FakeApiServer, models: StaticBaseModels,
                                         watch: Callable[..., ConfigMapWatch]) -> None:
    apiserver.apply(o.configmap("other", {"baseModel": "x", "adapters": "- y"}, managed=False))
    watch()
    assert models.base_of("y") is None
    assert {q.get("labelSelector") for _, p, q in apiserver.requests if "configmaps" in p} == {
        "inference.networking.k8s.io/bbr-managed=true"}


def test_live_edits_and_deletes_are_followed(apiserver: FakeApiServer,
                                             models: StaticBaseModels,
                                             watch: Callable[..., ConfigMapWatch]) -> None:
    apiserver.apply(o.configmap("llama", {"baseModel": LLAMA, "adapters": "- a1"}))
    watch()
    apiserver.apply(o.configmap("llama", {"baseModel": LLAMA, "adapters": "- a1\n- a2"}))
    eventually(lambda: models.base_of("a2") == LLAMA)
    apiserver.apply(o.configmap("qwen", {"baseModel": "qwen", "adapters": "- q1"}))
    eventually(lambda: models.base_of("q1") == "qwen")
    apiserver.delete("v1", "ConfigMap", "llama", o.NS)
    eventually(lambda: models.base_of("a1") is None)
    assert models.base_of("q1") == "qwen"


def test_label_removed_drops_the_mapping(apiserver: FakeApiServer, models: StaticBaseModels,
                                         watch: Callable[..., ConfigMapWatch]) -> None:
    apiserver.apply(o.configmap("llama", {"baseModel": LLAMA, "adapters": "- a1"}))
    watch()
    apiserver.apply(o.configmap("llama", {"baseModel": LLAMA, "adapters": "- a1"},
                                managed=False))
    eventually(lambda: models.base_of("a1") is None)


def test_malformed_configmap_is_logged_and_skipped(apiserver: FakeApiServer,
                                                   models: StaticBaseModels,
                                                   watch: Callable[..., ConfigMapWatch]) -> None:
    apiserver.apply(o.configmap("broken", {"adapters": "- orphan"}))
    apiserver.apply(o.configmap("fine", {"baseModel": LLAMA, "adapters": "- a1"}))
    with capture_logs() as logs:
        watch()
    assert models.base_of("a1") == LLAMA
    assert models.base_of("orphan") is None
    bad = [e for e in logs if e["event"] == "invalid base-model ConfigMap skipped"]
    assert bad and "ConfigMap llm/broken" in bad[0]["error"]
    assert "'baseModel' must be a non-empty string" in bad[0]["error"]


def test_all_namespaces_when_no_namespace_is_given(apiserver: FakeApiServer,
                                                   models: StaticBaseModels,
                                                   watch: Callable[..., ConfigMapWatch]) -> None:
    apiserver.apply(o.configmap("a", {"baseModel": "base-a", "adapters": "- la"},
                                namespace="team-a"))
    apiserver.apply(o.configmap("b", {"baseModel": "base-b", "adapters": "- lb"},
                                namespace="team-b"))
    watch(None)
    assert (models.base_of("la"), models.base_of("lb")) == ("base-a", "base-b")


def test_namespace_scope_ignores_other_namespaces(apiserver: FakeApiServer,
                                                  models: StaticBaseModels,
                                                  watch: Callable[..., ConfigMapWatch]) -> None:
    apiserver.apply(o.configmap("a", {"baseModel": "base-a", "adapters": "- la"},
                                namespace="elsewhere"))
    watch(o.NS)
    assert models.base_of("la") is None


def test_mapping_survives_a_410_relist(apiserver: FakeApiServer, models: StaticBaseModels,
                                       watch: Callable[..., ConfigMapWatch]) -> None:
    apiserver.apply(o.configmap("llama", {"baseModel": LLAMA, "adapters": "- a1"}))
    watch()
    apiserver.sever_watches()
    apiserver.apply(o.configmap("llama", {"baseModel": LLAMA, "adapters": "- a2"}))
    apiserver.compact()
    apiserver.resume_watches()
    eventually(lambda: models.base_of("a2") == LLAMA and models.base_of("a1") is None)
