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
from devkit.otlp import load as load_spans
from devkit.stack import DEFAULT_CONFIG
from shared.upstream_flags import SERVICE_NAMES

pytestmark = pytest.mark.envoy
#: The services' default OTEL_SERVICE_NAME (upstream's).
BBR, EPP = SERVICE_NAMES["bbr"], SERVICE_NAMES["epp"]


def config_on_free_ports(tmp_path: Path, demo_requests: int = 20,
                         example: Path = DEFAULT_CONFIG) -> Path:
    spec = yaml.safe_load(example.read_text())
    spec["gateway"] = {"port": free_port(), "admin_port": free_port()}
    spec["bbr"] = {"grpc_port": free_port(), "health_port": free_port(),
                   "metrics_port": free_port()}
    server_port = free_port()
    for pool in spec["pools"]:
        pool["epp"] = {"grpc_port": free_port(), "health_port": free_port(),
                       "metrics_port": free_port()}
        pool["server_port"] = server_port
        if "pd" in pool:
            pool["pd"]["vllm_port"] = free_port()
        if "epp_config" in pool:
            pool["epp_config"] = str(example.parent / pool["epp_config"])
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
    # GET /v1/models through the real Envoy: BBR answers with both pools' models.
    listed = next(line for line in proc.stdout.splitlines()
                  if line.startswith("GET /v1/models lists: "))
    assert sorted(listed.removeprefix("GET /v1/models lists: ").split(", ")) == sorted([
        "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
        "sql-lora-v1", "sql-lora-v2", "sql-lora"])
    assert (tmp_path / "run" / "logs" / "epp-llama.log").exists()
    envoy_cfg = yaml.safe_load((tmp_path / "run" / "envoy" / "envoy.yaml").read_text())
    runtime = envoy_cfg["layered_runtime"]["layers"][0]["static_layer"]
    assert runtime["envoy.reloadable_features.ext_proc_graceful_grpc_close"] is True
    # Traces: the stack's OTLP receiver got the demo's traces, Envoy's, BBR's and the EPP's
    # spans in one trace, and the screen names the file.
    traces = tmp_path / "run" / "traces.jsonl"
    assert f"Traces: {traces}" in proc.stdout
    services: dict[str, set[str]] = {}
    for span in load_spans(traces):
        services.setdefault(span.trace_id, set()).add(span.service)
    assert any({"envoy-gateway", BBR, EPP} <= found for found in services.values()), services


def test_pd_example_prefills_long_prompts_on_prefill_pods(tmp_path: Path) -> None:
    """examples/stack-pd.yaml: the decider sends the demo's long new documents (every fourth
    request) to a prefill pod through a decode pod's sidecar; the rest stay local."""
    cfg = config_on_free_ports(tmp_path, example=DEFAULT_CONFIG.parent / "stack-pd.yaml")
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "devkit.stack", "--config", str(cfg), "--exit-after-demo",
         "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "20/20 demo requests succeeded" in proc.stdout
    assert ("P/D pool llama-pd (2 prefill + 2 decode pods): 5 requests prefilled on a "
            "prefill pod, 15 decoded alone") in proc.stdout
    # Envoy only ever sent requests to the decode pods (their sidecars).
    assert "llama-pd-2" in proc.stdout and "llama-pd-3" in proc.stdout
    assert "llama-pd-0" not in proc.stdout and "llama-pd-1" not in proc.stdout
    pods = [d for d in yaml.safe_load_all((run_dir / "llama-pd" / "manifests.yaml").read_text())
            if d["kind"] == "Pod"]
    assert [p["metadata"]["labels"]["llm-d.ai/role"] for p in pods] == [
        "prefill", "prefill", "decode", "decode"]
    assert len(list((run_dir / "logs").glob("sidecar-llama-pd-*.log"))) == 2


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


def test_two_active_active_epp_replicas_share_a_valkey_the_stack_runs(tmp_path: Path) -> None:
    cfg = config_on_free_ports(tmp_path)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "devkit.stack", "--config", str(cfg), "--exit-after-demo",
         "--run-dir", str(run_dir), "--epp-replicas", "2"],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "20/20 demo requests succeeded" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("EPP replicas per pool"))
    # The Valkey has a password (redacted) and the replicas sign what they write.
    assert line.startswith("EPP replicas per pool: 2 (active-active, state store valkey://:***@")
    for pool in ("llama", "qwen"):
        for log in (f"epp-{pool}.log", f"epp-{pool}-1.log"):
            text = (run_dir / "logs" / log).read_text()
            assert "state store reachable; sharing routing state" in text, log
            assert "state store without a shared secret" not in text, log
    envoy_cfg = yaml.safe_load((run_dir / "envoy" / "envoy.yaml").read_text())
    cluster = next(c for c in envoy_cfg["static_resources"]["clusters"]
                   if c["name"] == "epp-llama")
    assert len(cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    assert cluster["health_checks"][0]["grpc_health_check"] == {}
    # The stack stopped the Valkey it started.
    port = int(line.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epp-replicas", "0"], "--epp-replicas must be at least 1, got 0"),
        (["--state-store", "memory://"], "add --epp-replicas 2"),
        (["--epp-replicas", "2", "--state-store", "ftp://x"], "--state-store: "),
    ],
)
def test_bad_replica_flags_give_one_clear_line(tmp_path: Path, args: list[str],
                                               message: str) -> None:
    cfg = config_on_free_ports(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "devkit.stack", "--config", str(cfg),
                           "--exit-after-demo", "--run-dir", str(tmp_path / "run"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gateway-stack: error: "), proc.stderr
    assert message in lines[0]
