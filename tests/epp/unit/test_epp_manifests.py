"""The manifests source: files, directories, validation errors and live reload."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from epp.datastore import Datastore
from epp.sources import ManifestError, ManifestSource, load_snapshot

POOL = """\
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: pool}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}}
"""


def pod(name: str, ip: str) -> str:
    return f"""\
apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: vllm}}}}
status: {{podIP: {ip}}}
"""


def write(path: Path, *docs: str) -> Path:
    path.write_text("---\n".join(docs))
    return path


def test_single_file_with_several_documents(tmp_path: Path) -> None:
    f = write(tmp_path / "m.yaml", POOL, pod("a", "10.0.0.1"), pod("b", "10.0.0.2"))
    snap = load_snapshot(f, pool_name=None, pool_namespace="default")
    assert [e.key for e in snap.endpoints] == ["10.0.0.1:8000", "10.0.0.2:8000"]


def test_directory_of_files(tmp_path: Path) -> None:
    write(tmp_path / "pool.yaml", POOL)
    write(tmp_path / "pods.yml", pod("a", "10.0.0.1"))
    (tmp_path / "notes.txt").write_text("not yaml: [")
    snap = load_snapshot(tmp_path, pool_name="pool", pool_namespace="default")
    assert len(snap.endpoints) == 1


def test_invalid_field_error_names_file_object_and_field(tmp_path: Path) -> None:
    f = write(tmp_path / "m.yaml", POOL.replace("number: 8000", "number: 0"))
    with pytest.raises(ManifestError) as info:
        load_snapshot(f, pool_name=None, pool_namespace="default")
    err = info.value
    assert (err.file, err.obj, err.field) == (str(f), "InferencePool/pool",
                                              "spec.targetPorts[0].number")
    assert str(f) in str(err) and "InferencePool/pool" in str(err)


def test_bad_yaml_error_names_the_file(tmp_path: Path) -> None:
    f = write(tmp_path / "m.yaml", "kind: [unclosed\n")
    with pytest.raises(ManifestError, match=r"m\.yaml: not valid YAML"):
        load_snapshot(f, pool_name=None, pool_namespace="default")


def test_object_defined_twice_is_an_error(tmp_path: Path) -> None:
    f = write(tmp_path / "m.yaml", POOL, pod("a", "10.0.0.1"), pod("a", "10.0.0.2"))
    with pytest.raises(ManifestError, match="Pod/a: defined twice"):
        load_snapshot(f, pool_name=None, pool_namespace="default")


def test_missing_pool_is_an_error(tmp_path: Path) -> None:
    f = write(tmp_path / "m.yaml", pod("a", "10.0.0.1"))
    with pytest.raises(ManifestError, match="no InferencePool"):
        load_snapshot(f, pool_name=None, pool_namespace="default")


def test_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such file"):
        load_snapshot(tmp_path / "nope.yaml", pool_name=None, pool_namespace="default")


def test_kubectl_list_output_is_accepted(tmp_path: Path) -> None:
    items = "\n".join("- " + doc.replace("\n", "\n  ").rstrip() for doc in
                      (POOL, pod("a", "10.0.0.1")))
    f = write(tmp_path / "m.yaml", f"apiVersion: v1\nkind: List\nitems:\n{items}\n")
    assert len(load_snapshot(f, pool_name=None, pool_namespace="default").endpoints) == 1


async def wait_for(check, timeout: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_watch_applies_an_edit_live(tmp_path: Path) -> None:
    f = write(tmp_path / "m.yaml", POOL, pod("a", "10.0.0.1"))
    ds = Datastore()
    source = ManifestSource(f, ds, poll_interval=0.02)
    source.load()
    task = asyncio.create_task(source.run())
    try:
        write(f, POOL, pod("a", "10.0.0.1"), pod("b", "10.0.0.2"))
        await wait_for(lambda: len(ds.views()) == 2)
    finally:
        task.cancel()


async def test_broken_edit_keeps_the_last_good_state(tmp_path: Path) -> None:
    f = write(tmp_path / "m.yaml", POOL, pod("a", "10.0.0.1"))
    ds = Datastore()
    source = ManifestSource(f, ds, poll_interval=0.02)
    source.load()
    task = asyncio.create_task(source.run())
    try:
        write(f, POOL.replace("number: 8000", "number: -1"), pod("b", "10.0.0.2"))
        await asyncio.sleep(0.2)  # several polls see the broken file
        assert [v.key for v in ds.views()] == ["10.0.0.1:8000"]
        write(f, POOL, pod("b", "10.0.0.2"))  # fixed again: now it applies
        await wait_for(lambda: [v.key for v in ds.views()] == ["10.0.0.2:8000"])
    finally:
        task.cancel()


def test_broken_edit_is_logged_with_the_reason(tmp_path: Path) -> None:
    import structlog.testing

    f = write(tmp_path / "m.yaml", POOL)
    source = ManifestSource(f, Datastore())
    source.load()
    write(f, "kind: [oops\n")
    with structlog.testing.capture_logs() as logs:
        assert source.reload_if_changed() is False
    assert any("not valid YAML" in entry.get("error", "") for entry in logs)


def test_startup_load_fails_fast_on_a_broken_file(tmp_path: Path) -> None:
    broken = POOL.replace("targetPorts: [{number: 8000}]", "targetPorts: []")
    f = write(tmp_path / "m.yaml", broken)
    with pytest.raises(ManifestError, match=r"spec\.targetPorts"):
        ManifestSource(f, Datastore()).load()
