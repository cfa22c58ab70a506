"""The ``epp`` command's answers to bad flags, configs and manifests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devkit.manifests import pool_manifests, write_yaml

EPP = [sys.executable, "-m", "epp.main"]


def run_epp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EPP, *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "pool.yaml"
    write_yaml(path, pool_manifests("pool", [("p0", "127.0.1.1")], 8000))
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--refresh-metrics-interval", "soon"], "invalid duration 'soon'"),
        (["--secure-serving=perhaps"], "invalid boolean 'perhaps'"),
        (["--config-file", "a", "--config-text", "b"], "not allowed with argument"),
        (["--endpoint-selector", "app=x"], "--endpoint-selector needs --endpoint-target-ports"),
    ],
)
def test_bad_flags_exit_nonzero_with_one_line(args: list[str], message: str) -> None:
    proc = run_epp(*args)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]


def test_bad_config_exits_with_one_line_naming_the_problem(manifests: Path) -> None:
    proc = run_epp("--manifests", str(manifests), "--config-text",
                   "plugins:\n- type: no-such-scorer\n")
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0
    assert "no-such-scorer" in proc.stderr


def test_missing_config_file_exits_with_one_line(manifests: Path) -> None:
    proc = run_epp("--manifests", str(manifests), "--config-file", "/no/such/config.yaml")
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0
    assert "/no/such/config.yaml" in proc.stderr


def test_invalid_manifest_names_file_object_and_field(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    docs = pool_manifests("pool", [("p0", "127.0.1.1")], 8000)
    docs[0]["spec"]["targetPorts"] = [{"number": "eighty"}]
    write_yaml(path, docs)
    proc = run_epp("--manifests", str(path))
    assert proc.returncode != 0
    line = proc.stderr.strip()
    assert line.count("\n") == 0
    assert str(path) in line and "InferencePool" in line and "targetPorts" in line


def test_missing_manifests_path_exits_with_one_line() -> None:
    proc = run_epp("--manifests", "/no/such/dir")
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0
    assert "/no/such/dir" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ha-mode", "both"], "argument --ha-mode: invalid choice: 'both'"),
        (["--ha-mode", "active-active", "--ha-enable-leader-election"],
         "drop --ha-enable-leader-election"),
        (["--ha-mode", "active-active", "--state-store", "ftp://h:1/0"], "--state-store: "),
        (["--ha-mode", "active-active", "--state-store", "valkey://h:1/0?bogus=1"], "bogus"),
        (["--state-store", "valkey://h:1/0"], "add --ha-mode active-active"),
    ],
)
def test_bad_ha_flags_exit_with_one_line(manifests: Path, args: list[str],
                                         message: str) -> None:
    proc = run_epp("--manifests", str(manifests), *args)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]


def test_a_kv_events_socket_that_cannot_be_bound_exits_with_one_line(manifests: Path) -> None:
    """precise-prefix-cache-producer (the scorer's v0.10 form, which does not log a
    deprecation) binds kvEventsConfig.zmqEndpoint before serving."""
    import zmq

    taken: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    taken.bind("tcp://127.0.0.1:*")
    try:
        address = taken.getsockopt_string(zmq.LAST_ENDPOINT)
        proc = run_epp("--manifests", str(manifests), "--config-text", f"""\
plugins:
- type: precise-prefix-cache-producer
  parameters: {{kvEventsConfig: {{zmqEndpoint: "{address}"}}}}
- type: queue-scorer
""")
    finally:
        taken.close(linger=0)
    assert proc.returncode != 0
    line = proc.stderr.strip()
    assert line.count("\n") == 0, proc.stderr
    assert "precise-prefix-cache-producer" in line and "kvEventsConfig.zmqEndpoint" in line
    assert address in line
