"""Anthropic Messages, vLLM ``/inference/v1/generate`` and SGLang ``/generate`` through
``gateway-stack`` (what ``make run`` starts: Envoy, BBR, the pools' EPPs and simulated vLLM
servers), with the official ``anthropic`` client and each engine's native request shapes,
streamed and not: the client's model is rewritten for the server and restored in the answer,
and malformed bodies are answered in each API's error shape."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import httpx
import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.system.stack.test_gateway_stack import config_on_free_ports

pytestmark = pytest.mark.envoy

#: The example stack's rewrite: clients ask for sql-lora, the qwen pool serves v1 or v2.
ASKED = "sql-lora"

#: The pools' EPP config: every HTTP parser, the vLLM one before SGLang's shorter suffix.
EPP_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: vllmhttp-parser}
- {type: sglanghttp-parser}
- {type: anthropic-parser}
- {type: openai-parser}
- {type: queue-scorer}
- {type: prefix-cache-scorer}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: prefix-cache-scorer}]
requestHandler:
  parsers:
  - pluginRef: vllmhttp-parser
  - pluginRef: sglanghttp-parser
  - pluginRef: anthropic-parser
  - pluginRef: openai-parser
"""


@dataclass
class Running:
    url: str
    #: What the stack printed up to "Running.".
    screen: str
    #: One qwen pod's own address (the example stack's first qwen pod).
    qwen_pod: str
    #: The qwen pool EPP's metrics URL.
    qwen_metrics: str


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """``gateway-stack`` on free ports with every HTTP parser in its EPPs."""
    tmp = tmp_path_factory.mktemp("protocols")
    (tmp / "epp.yaml").write_text(EPP_CONFIG)
    cfg = config_on_free_ports(tmp, demo_requests=4)
    spec = yaml.safe_load(cfg.read_text())
    for pool in spec["pools"]:
        pool["epp_config"] = str(tmp / "epp.yaml")
    cfg.write_text(yaml.safe_dump(spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "devkit.stack", "--config", str(cfg), "--run-dir",
         str(tmp / "run")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    screen: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        screen.append(line)
        if line.startswith("Running."):
            break
    try:
        assert screen and screen[-1].startswith("Running."), "".join(screen)
        yield Running(f"http://127.0.0.1:{spec['gateway']['port']}", "".join(screen),
                      f"127.0.11.1:{spec['pools'][1]['server_port']}",
                      f"http://127.0.0.1:{spec['pools'][1]['epp']['metrics_port']}/metrics")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def sse_data(text: str) -> list[dict]:
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_make_run_prints_one_line_per_protocol(gateway: Running) -> None:
    lines = gateway.screen.splitlines()
    assert f"Other protocols, one request each for {ASKED}:" in lines
    for label in ("Anthropic /v1/messages, streamed", "vLLM /inference/v1/generate",
                  "SGLang /generate, streamed"):
        line = next(x for x in lines if x.strip().startswith(label))
        assert " 200 qwen-" in line and " out tokens" in line and len(line) <= 100, line
    anthropic_line = next(x for x in lines if "Anthropic" in x)
    assert anthropic_line.endswith(f"answer names {ASKED}")


def test_anthropic_client_whole_streamed_and_count_tokens(gateway: Running) -> None:
    url = gateway.url
    client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)
    raw = client.messages.with_raw_response.create(
        model=ASKED, max_tokens=6, system="Be brief.",
        messages=[{"role": "user", "content": "Hello there"}])
    msg = raw.parse()
    assert raw.headers["x-inference-pod"].startswith("qwen-")
    assert msg.model == ASKED and msg.usage.output_tokens == 6 and msg.usage.input_tokens > 0
    with client.messages.stream(model=ASKED, max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "text", "text": "Stream please"}]}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.model == ASKED and final.usage.output_tokens == 5 and text
    count = client.messages.count_tokens(model="Qwen/Qwen2.5-7B-Instruct", messages=[
        {"role": "user", "content": "Hello there"}])
    assert count.input_tokens > 0


def test_anthropic_bad_bodies_get_anthropic_errors(gateway: Running) -> None:
    url = gateway.url
    client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=ASKED, max_tokens=5, messages=[])
    body = err.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    r = httpx.post(url + "/v1/messages", content=b"{not json", timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.headers["content-type"] == "application/json"


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_generate_with_token_ids(gateway: Running, stream: bool) -> None:
    url = gateway.url
    body = {"model": ASKED, "token_ids": list(range(1, 40)), "stream": stream,
            "sampling_params": {"max_tokens": 4}}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = httpx.post(url + "/inference/v1/generate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-inference-pod"].startswith("qwen-")
    if stream:
        chunks = sse_data(r.text)
        assert sum(len(c["choices"][0]["token_ids"]) for c in chunks if c["choices"]) == 4
        assert chunks[-1]["usage"]["prompt_tokens"] == 39
    else:
        assert len(r.json()["choices"][0]["token_ids"]) == 4


@pytest.mark.parametrize("stream", [False, True])
def test_sglang_generate_text_and_input_ids(gateway: Running, stream: bool) -> None:
    url = gateway.url
    for prompt in ({"text": "Hello SGLang"}, {"input_ids": [7, 8, 9, 10]}):
        r = httpx.post(url + "/generate", timeout=30, json={
            "model": ASKED, **prompt, "stream": stream,
            "sampling_params": {"max_new_tokens": 3}})
        assert r.status_code == 200, r.text
        meta = sse_data(r.text)[-1]["meta_info"] if stream else r.json()["meta_info"]
        assert meta["completion_tokens"] == 3


@pytest.mark.parametrize(("path", "body"), [
    ("/inference/v1/generate", {"model": ASKED, "token_ids": []}),
    ("/inference/v1/generate", {"model": ASKED, "token_ids": [1, "x"]}),
    ("/generate", {"model": ASKED}),
    ("/generate", {"model": ASKED, "text": "a", "input_ids": [1]}),
])
def test_malformed_native_bodies_are_openai_style_400s(gateway: Running, path: str,
                                                       body: dict) -> None:
    url = gateway.url
    r = httpx.post(url + path, json=body, timeout=10)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["code"] == "invalid_body" and err["type"] == "invalid_request_error"


def test_a_body_without_model_is_a_clear_400_at_bbr(gateway: Running) -> None:
    """SGLang's own body names no model: BBR cannot pick a pool for it (documented)."""
    url = gateway.url
    r = httpx.post(url + "/generate", json={"text": "x"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_model"


def test_the_gateway_rewrote_the_model_the_pod_does_not_serve(gateway: Running) -> None:
    """The same bodies sent straight to a qwen pod are refused (404: it serves sql-lora-v1/v2,
    not sql-lora), so the 200s above mean the EPP rewrote the model on the way."""
    for path, body in (("/v1/messages", {"model": ASKED, "max_tokens": 2, "messages": [
            {"role": "user", "content": "x"}]}),
            ("/inference/v1/generate", {"model": ASKED, "token_ids": [1, 2],
                                        "sampling_params": {"max_tokens": 2}})):
        r = httpx.post(f"http://{gateway.qwen_pod}{path}", json=body, timeout=10)
        assert r.status_code == 404, (path, r.text)
        served = {**body, "model": "sql-lora-v1"}
        assert httpx.post(f"http://{gateway.qwen_pod}{path}", json=served,
                          timeout=10).status_code == 200


def token_sums(metrics_url: str) -> tuple[float, float]:
    """(input, output) token sums the EPP recorded for requests that asked for ``ASKED``."""
    sums = [0.0, 0.0]
    for fam in text_string_to_metric_families(httpx.get(metrics_url, timeout=5).text):
        for i, name in enumerate(("inference_objective_input_tokens",
                                  "inference_objective_output_tokens")):
            if fam.name == name:
                sums[i] += sum(x.value for x in fam.samples if x.name.endswith("_sum")
                               and x.labels.get("model_name") == ASKED)
    return sums[0], sums[1]


@pytest.mark.parametrize(("path", "body", "tokens"), [
    ("/v1/messages", {"model": ASKED, "max_tokens": 3, "stream": True,
                      "messages": [{"role": "user", "content": "count me"}]}, 3),
    ("/v1/messages", {"model": ASKED, "max_tokens": 4,
                      "messages": [{"role": "user", "content": "count me"}]}, 4),
    ("/inference/v1/generate", {"model": ASKED, "token_ids": list(range(1, 21)),
                                "sampling_params": {"max_tokens": 5}}, 5),
    ("/generate", {"model": ASKED, "input_ids": list(range(1, 11)), "stream": True,
                   "sampling_params": {"max_new_tokens": 6}}, 6),
], ids=["anthropic-streamed", "anthropic", "vllm-generate", "sglang-streamed"])
def test_the_epp_accounts_each_protocols_usage(gateway: Running, path: str, body: dict,
                                               tokens: int) -> None:
    before = token_sums(gateway.qwen_metrics)
    r = httpx.post(gateway.url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 5
    while (after := token_sums(gateway.qwen_metrics)) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert after[1] - before[1] == tokens
    if "token_ids" in body or "input_ids" in body:  # token ids: the exact prompt count
        assert after[0] - before[0] == len(body.get("token_ids") or body["input_ids"])
    else:
        assert after[0] - before[0] > 0
