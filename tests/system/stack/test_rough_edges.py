"""What a new user meets in ``make run`` (issue #30), on a running ``gateway-stack`` with a
P/D pool, through the real Envoy: errors as OpenAI JSON, every service port on loopback,
``/debug`` and the P/D roles, one name per endpoint, clean metrics, the stack file's flags
reaching the services, and logs of this stack only."""

from __future__ import annotations

import ipaddress
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit.stack import DEFAULT_CONFIG
from shared import buildinfo
from tests.system.stack.test_gateway_stack import config_on_free_ports

pytestmark = pytest.mark.envoy
JSON = {"content-type": "application/json"}
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class RunningStack:
    spec: dict[str, Any]
    run_dir: Path
    stale_log: Path

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{self.spec['gateway']['port']}"

    @property
    def epp_metrics(self) -> str:
        return f"http://127.0.0.1:{self.spec['pools'][0]['epp']['metrics_port']}"

    @property
    def bbr_metrics(self) -> str:
        return f"http://127.0.0.1:{self.spec['bbr']['metrics_port']}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    tmp = tmp_path_factory.mktemp("stack")
    cfg = config_on_free_ports(tmp, demo_requests=4,
                               example=DEFAULT_CONFIG.parent / "stack-pd.yaml")
    spec = yaml.safe_load(cfg.read_text())
    spec["bbr"]["flags"] = ["-v", "4"]
    spec["pools"][0]["epp"]["flags"] = "-v 4"
    cfg.write_text(yaml.safe_dump(spec))
    run_dir = tmp / "run"
    stale = run_dir / "logs" / "epp-a-pool-of-an-earlier-stack.log"
    stale.parent.mkdir(parents=True)
    stale.write_text("old\n")
    (run_dir / "envoy").mkdir()
    (run_dir / "envoy" / "envoy.log").write_text("an earlier stack's Envoy\n")
    out = (tmp / "stack.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "devkit.stack", "--config", str(cfg),
                             "--run-dir", str(run_dir)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while "Press Ctrl-C" not in (tmp / "stack.log").read_text():
            assert proc.poll() is None, (tmp / "stack.log").read_text()
            assert time.monotonic() < deadline, (tmp / "stack.log").read_text()
            time.sleep(0.2)
        yield RunningStack(spec, run_dir, stale)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()


# --- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("body", "status", "code"),
    [(b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "missing_model"),
     (b'{"model": "", "messages": []}', 400, "missing_model"),
     (b'{"model": 7, "messages": []}', 400, "invalid_model"),
     (b'{"model": "gpt-5-turbo", "messages": []}', 404, "model_not_found")],
)
def test_unroutable_requests_get_openai_json_errors(stack: RunningStack, body: bytes,
                                                   status: int, code: str) -> None:
    r = httpx.post(f"{stack.gateway}/v1/chat/completions", content=body, headers=JSON)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == code
    if status == 404:
        assert "gpt-5-turbo" in r.json()["error"]["message"]
        assert MODEL in r.json()["error"]["message"]


# --- loopback ---------------------------------------------------------------------------------

def listening(port: int) -> set[str]:
    """Addresses with a TCP socket listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                # the kernel prints each 32-bit word in host (little-endian) order
                raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1]
                               for i in range(0, len(addr), 8))
                ip = ipaddress.ip_address(raw)
                mapped = getattr(ip, "ipv4_mapped", None)
                found.add(str(mapped or ip))
    return found


def test_bbr_and_epp_listen_on_loopback_only(stack: RunningStack) -> None:
    ports = {f"bbr {k}": v for k, v in stack.spec["bbr"].items() if k.endswith("port")}
    ports |= {f"epp {k}": v for k, v in stack.spec["pools"][0]["epp"].items()
              if k.endswith("port")}
    for what, port in ports.items():
        assert listening(port) == {"127.0.0.1"}, what


# --- /debug ----------------------------------------------------------------------------------

def test_debug_lists_its_pages(stack: RunningStack) -> None:
    index = httpx.get(f"{stack.epp_metrics}/debug").json()
    assert {"/debug/pool", "/metrics"} <= set(index["pages"])
    for page in index["pages"]:
        assert httpx.get(stack.epp_metrics + page).status_code == 200


def test_debug_pool_shows_the_pd_roles(stack: RunningStack) -> None:
    endpoints = httpx.get(f"{stack.epp_metrics}/debug/pool").json()["endpoints"]
    assert [(e["pod"], e["role"]) for e in endpoints] == [
        ("llama-pd-0", "prefill"), ("llama-pd-1", "prefill"),
        ("llama-pd-2", "decode"), ("llama-pd-3", "decode")]


def test_one_endpoint_goes_by_the_same_names_in_debug_metrics_and_headers(
        stack: RunningStack) -> None:
    """The pod that served (the server's ``x-inference-pod``) and the endpoint Envoy was told
    (``x-gateway-destination-endpoint``, echoed by the server) are one ``/debug/pool`` entry,
    whose ``name`` is the metrics' ``model_server_pod`` and whose pod the scheduler's
    ``pod_name``."""
    r = httpx.post(f"{stack.gateway}/v1/chat/completions", headers=JSON, json={
        "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    endpoints = httpx.get(f"{stack.epp_metrics}/debug/pool").json()["endpoints"]
    (served,) = [e for e in endpoints if e["pod"] == r.headers["x-inference-pod"]]
    assert served["address"].endswith(":" + r.headers["x-inference-port"]) or served["role"]
    families = {f.name: f for f in text_string_to_metric_families(
        httpx.get(f"{stack.epp_metrics}/metrics").text)}
    per_pod = {s.labels["model_server_pod"] for s in families[
        "inference_pool_per_pod_queue_size"].samples}
    assert per_pod == {e["name"] for e in endpoints}
    assert served["name"] == f"{served['pod']}-rank-0"
    picked = {s.labels["pod_name"] for s in families["inference_extension_scheduler_attempts"]
              .samples if s.labels.get("status") == "success"}
    assert served["pod"] in picked


# --- metrics ---------------------------------------------------------------------------------

@pytest.mark.parametrize("service", ["epp", "bbr"])
def test_no_created_series_and_the_build_in_the_info_gauge(stack: RunningStack,
                                                           service: str) -> None:
    base = stack.epp_metrics if service == "epp" else stack.bbr_metrics
    text = httpx.get(f"{base}/metrics").text
    assert not re.search(r"(?m)^\w+_created[{ ]", text)
    info = "inference_extension_info" if service == "epp" else "bbr_info"
    (sample,) = [s for f in text_string_to_metric_families(text) if f.name == info
                 for s in f.samples]
    assert sample.labels == {"commit": buildinfo.commit(), "build_ref": buildinfo.version()}
    assert re.fullmatch(r"[0-9a-f]{40}", sample.labels["commit"])  # a checkout knows it


# --- the stack file and its logs -----------------------------------------------------------------

def test_flags_from_the_stack_file_reach_bbr_and_the_epp(stack: RunningStack) -> None:
    """``-v 4`` from the file: both services log at debug level."""
    for log in ("bbr.log", "epp-llama-pd.log"):
        text = (stack.run_dir / "logs" / log).read_text()
        assert re.search(r'"level": ?"debug"|\[debug|^DEBUG ', text, re.M), log


def test_logs_are_this_stacks_only(stack: RunningStack) -> None:
    assert not stack.stale_log.exists()
    assert "an earlier stack's Envoy" not in (stack.run_dir / "envoy" / "envoy.log").read_text()
    assert (stack.run_dir / "logs" / "bbr.log").exists()
