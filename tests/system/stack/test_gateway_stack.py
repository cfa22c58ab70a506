"""``gateway-stack`` (what ``make run`` starts) end to end, on free ports."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from devkit.envoy import free_port
from devkit.stack import DEFAULT_CONFIG

pytestmark = pytest.mark.envoy


def config_on_free_ports(tmp_path: Path, demo_requests: int = 20) -> Path:
    spec = yaml.safe_load(DEFAULT_CONFIG.read_text())
    spec["gateway"] = {"port": free_port(), "admin_port": free_port()}
    spec["bbr"] = {"grpc_port": free_port(), "health_port": free_port(),
                   "metrics_port": free_port()}
    server_port = free_port()
    for pool in spec["pools"]:
        pool["epp"] = {"grpc_port": free_port(), "health_port": free_port(),
                       "metrics_port": free_port()}
        pool["server_port"] = server_port
    spec["demo"]["requests"] = demo_requests
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_example_stack_serves_the_demo_through_both_pools(tmp_path: Path) -> None:
    cfg = config_on_free_ports(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "devkit.stack", "--config", str(cfg), "--exit-after-demo",
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "20/20 demo requests succeeded" in proc.stdout
    for pod in ("llama-", "qwen-"):
        assert pod in proc.stdout
    assert "sql-lora-v1" in proc.stdout and "sql-lora-v2" in proc.stdout
    assert (tmp_path / "run" / "logs" / "epp-llama.log").exists()
    envoy_cfg = yaml.safe_load((tmp_path / "run" / "envoy" / "envoy.yaml").read_text())
    runtime = envoy_cfg["layered_runtime"]["layers"][0]["static_layer"]
    assert runtime["envoy.reloadable_features.ext_proc_graceful_grpc_close"] is True


def test_busy_port_gives_one_clear_line(tmp_path: Path) -> None:
    cfg = config_on_free_ports(tmp_path)
    port = yaml.safe_load(cfg.read_text())["gateway"]["port"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        proc = subprocess.run(
            [sys.executable, "-m", "devkit.stack", "--config", str(cfg), "--exit-after-demo",
             "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip() == (
        f"gateway-stack: error: port {port} (gateway listener (--port)) is already in use; "
        "change it in the config file or with --port")


def test_bad_config_gives_one_clear_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("pools: []\n")
    proc = subprocess.run([sys.executable, "-m", "devkit.stack", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip() == f"gateway-stack: error: {cfg}: needs a non-empty 'pools' list"


def test_ctrl_c_stops_every_child(tmp_path: Path) -> None:
    cfg = config_on_free_ports(tmp_path, demo_requests=5)
    run_dir = tmp_path / "run"
    log = (tmp_path / "stack.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "devkit.stack", "--config", str(cfg), "--run-dir", str(run_dir)],
        stdout=log, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # as `cmd &` does
    try:
        deadline = time.monotonic() + 120
        while "Press Ctrl-C" not in (tmp_path / "stack.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert "stopped every process." in (tmp_path / "stack.log").read_text()
    leftovers = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True)
    assert leftovers.stdout == ""
