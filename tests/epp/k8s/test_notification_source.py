"""``k8s-notification-source`` against the fake API server: a third-party extractor hears
objects of the watched kind being added, changed and deleted in the pool's namespace."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from epp.config import BUILTIN_PLUGINS, build, parse_config
from epp.datalayer import K8sNotificationSource, NotificationEvent, NotificationExtractor
from epp.datalayer.k8s_events import guess_resource
from epp.scheduling.plugin import Plugin
from shared.plugins import PluginRegistry
from tests.support.fake_apiserver import FakeApiServer
from tests.support.k8s import FAST

CONFIG = """
plugins:
- type: k8s-notification-source
  parameters: {group: "", version: v1, kind: ConfigMap}
- type: recorder
- type: queue-scorer
dataLayer:
  sources:
  - pluginRef: k8s-notification-source
    extractors: [{pluginRef: recorder}]
"""


def configmap(name: str, value: str, namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace}, "data": {"v": value}}


def test_configmap_events_reach_the_extractor(apiserver: FakeApiServer, kube: Any) -> None:
    heard: list[tuple[str, str]] = []

    class Recorder(Plugin, NotificationExtractor):
        type_name = "recorder"

        def on_notification(self, event: NotificationEvent) -> None:
            heard.append((event.kind.value, event.object["metadata"]["name"]))

    apiserver.apply(configmap("before", "1"))
    apiserver.apply(configmap("elsewhere", "1", namespace="other"))
    runtime = build(parse_config(CONFIG), registry=PluginRegistry((*BUILTIN_PLUGINS, Recorder)))
    # beside the default metrics source that dataLayer.injectDefaults adds (llm-d v0.10)
    (source,) = [s for s in runtime.data_sources if isinstance(s, K8sNotificationSource)]
    source.connect(kube, "default", timing=FAST)

    async def until(want: list[tuple[str, str]]) -> None:
        for _ in range(200):
            if heard == want:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"heard {heard}, want {want}")

    async def go() -> None:
        task = asyncio.ensure_future(source.run(runtime.datastore))
        try:
            await until([("added", "before")])
            await asyncio.to_thread(apiserver.apply, configmap("new", "1"))
            await asyncio.to_thread(apiserver.apply, configmap("before", "2"))
            await asyncio.to_thread(apiserver.delete, "v1", "ConfigMap", "new")
            await until([("added", "before"), ("added", "new"), ("updated", "before"),
                         ("deleted", "new")])
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())


@pytest.mark.parametrize(("kind", "resource"), [
    ("ConfigMap", "configmaps"), ("Policy", "policies"), ("Endpoints", "endpoints"),
    ("Ingress", "ingresses"), ("InferencePool", "inferencepools")])
def test_resource_names_are_guessed_as_kubernetes_does(kind: str, resource: str) -> None:
    assert guess_resource(kind) == resource


def test_unknown_core_kind_is_refused(kube: Any) -> None:
    from epp.datalayer.k8s_events import NotificationSourceParameters

    source = K8sNotificationSource("s", NotificationSourceParameters(version="v1", kind="Gizmo"))
    with pytest.raises(ValueError, match="no namespaced core kind v1/Gizmo"):
        source.connect(kube, "default")


def test_epp_with_manifests_refuses_a_notification_source(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from epp.main import connect_notification_sources, parser

    class Recorder(Plugin, NotificationExtractor):
        type_name = "recorder"

        def on_notification(self, event: NotificationEvent) -> None:
            pass

    runtime = build(parse_config(CONFIG), registry=PluginRegistry((*BUILTIN_PLUGINS, Recorder)))
    args = parser().parse_args(["--manifests", str(tmp_path / "pool.yaml")])
    with pytest.raises(SystemExit) as e:
        connect_notification_sources(args, runtime)
    assert e.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "k8s-notification-source) needs the Kubernetes API, not --manifests" in line
