"""The ``vllm-sim`` command line: flags, config files, signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sim.main import build_parser, configs_from_args

CMD = [sys.executable, "-m", "sim.main"]


def configs(*argv: str):
    return configs_from_args(build_parser().parse_args(list(argv)))


def test_help_lists_every_flag() -> None:
    out = subprocess.run([*CMD, "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--port", "--ports", "--config", "--model", "--served-model-name",
                 "--engine", "--time-scale", "--max-num-seqs", "--max-waiting",
                 "--block-size", "--num-gpu-blocks", "--max-loras", "--lora-modules",
                 "--error-rate", "--hang", "--metrics-hang", "--kill-after", "--revive-after",
                 "--profile", "--gpu-cache-usage-metric"):
        assert flag in out


def test_bad_flag_exits_2_with_one_line() -> None:
    r = subprocess.run([*CMD, "--no-such-flag"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "--no-such-flag" in r.stderr


def test_bad_value_exits_2() -> None:
    r = subprocess.run([*CMD, "--ports", "9-3"], capture_output=True, text=True)
    assert r.returncode == 2 and "port range" in r.stderr


def test_port_flags_combine_into_one_server_per_port() -> None:
    cfgs = configs("--port", "7001", "--ports", "8001-8003", "--profile", "tiny",
                   "--max-num-seqs", "7", "--inter-token-latency", "20")
    assert [c.port for c in cfgs] == [7001, 8001, 8002, 8003]
    assert all(c.profile.max_num_seqs == 7 for c in cfgs)
    assert cfgs[0].profile.inter_token_latency == pytest.approx(0.020)
    assert len({c.seed for c in cfgs}) == 4  # independent randomness per server


def test_config_file_gives_heterogeneous_servers(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("""
defaults: {profile: tiny, time_scale: 0.5}
servers:
  - {port: 9101, name: fast}
  - port: 9102
    name: slow
    profile: 8b-h100
    overrides: {max_num_seqs: 8}
    engine: sglang
    faults: {error_rate: 0.5}
    lora_modules: [sql=/a/sql]
""")
    fast, slow = configs("--config", str(path))
    assert (fast.name, fast.profile.name, fast.time_scale) == ("fast", "tiny", 0.5)
    assert slow.profile.name == "8b-h100" and slow.profile.max_num_seqs == 8
    assert slow.engine == "sglang" and slow.faults.error_rate == 0.5
    assert slow.lora_modules == {"sql": "/a/sql"}


def test_config_file_with_unknown_key_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("- {port: 1, colour: blue}\n")
    r = subprocess.run([*CMD, "--config", str(path)], capture_output=True, text=True)
    assert r.returncode == 2 and "colour" in r.stderr


def test_serves_then_stops_cleanly_on_sigterm() -> None:
    proc = subprocess.Popen([*CMD, "--port", "0", "--port", "0", "--profile", "tiny"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("vllm-sim ready: ")
        urls = line.split()[2:]
        assert len(urls) == 2
        r = httpx.post(urls[1] + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_token_budget_and_chunked_prefill_flags_reach_the_profile() -> None:
    (cfg,) = configs("--port", "9000", "--max-num-batched-tokens", "2048",
                     "--no-enable-chunked-prefill")
    assert cfg.profile.max_num_batched_tokens == 2048
    assert not cfg.profile.enable_chunked_prefill
    (default,) = configs("--port", "9000")
    assert default.profile.max_num_batched_tokens == 8192
    assert default.profile.enable_chunked_prefill
    with pytest.raises(ValueError, match="max-num-batched-tokens"):
        configs("--port", "9000", "--max-num-batched-tokens", "0")


def test_calibrated_profile_and_speed_from_flags_and_fleet_file(tmp_path: Path) -> None:
    (cfg,) = configs("--port", "8001", "--profile", "h100-llama70b", "--speed", "0.5")
    assert cfg.profile.name == "h100-llama70b" and cfg.profile.speed == 0.5
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("servers:\n  - {port: 8001, profile: h100-llama8b}\n"
                     "  - {port: 8002, profile: a100-llama8b, overrides: {speed: 0.8}}\n")
    fast, slow = configs("--config", str(fleet))
    assert (fast.profile.name, fast.profile.speed) == ("h100-llama8b", 1.0)
    assert (slow.profile.name, slow.profile.speed) == ("a100-llama8b", 0.8)
