"""``gateway-stack`` (what ``make run`` starts) end to end, on free ports."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.stack import DEFAULT_CONFIG
from shared.envoy import free_port

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
        [sys.executable, "-m", "bench.stack", "--config", str(cfg), "--exit-after-demo",
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "20/20 demo requests succeeded" in proc.stdout
    for pod in ("llama-", "qwen-"):
        assert pod in proc.stdout
    assert "sql-lora-v1" in proc.stdout and "sql-lora-v2" in proc.stdout
    assert (tmp_path / "run" / "logs" / "epp-llama.log").exists()


def test_busy_port_gives_one_clear_line(tmp_path: Path) -> None:
    cfg = config_on_free_ports(tmp_path)
    port = yaml.safe_load(cfg.read_text())["gateway"]["port"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        proc = subprocess.run(
            [sys.executable, "-m", "bench.stack", "--config", str(cfg), "--exit-after-demo",
             "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip() == (
        f"gateway-stack: error: port {port} (gateway listener (--port)) is already in use; "
        "change it in the config file or with --port")


def test_bad_config_gives_one_clear_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("pools: []\n")
    proc = subprocess.run([sys.executable, "-m", "bench.stack", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip() == f"gateway-stack: error: {cfg}: needs a non-empty 'pools' list"
