"""Model servers' admin paths through the real Envoy (issue 31, item 5).

The pool routes pass only the inference APIs (``devkit.topology.INFERENCE_PATHS``); anything
else — ``/v1/unload_lora_adapter``, ``/reset_prefix_cache``, ``/metrics``, ``/sim/state``, dot
segments and encoded slashes that a server would normalise into one — gets the gateway's JSON
404 ``path_not_found`` and never reaches a pod, whatever the body names.
"""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.support.two_pools import TwoPools

pytestmark = pytest.mark.envoy

ADMIN = ["/v1/unload_lora_adapter", "/v1/load_lora_adapter", "/reset_prefix_cache",
         "/metrics", "/sim/state", "/sim/kill", "/v1/chat/completions/../../reset_prefix_cache",
         "/v1/chat%2Fcompletions", "/v1/completions/x", "//v1/completions", "/V1/COMPLETIONS"]


@pytest.mark.parametrize("path", ADMIN)
def test_admin_paths_are_refused_with_a_json_404(two_pools: TwoPools, path: str) -> None:
    tp = two_pools
    tp.reset()
    body = orjson.dumps({"model": "llama-8b", "lora_name": "adapter", "prompt": "x"})
    with httpx.Client(timeout=10) as client:
        for method in ("POST", "GET"):
            r = client.request(method, tp.gateway.url(path), content=body,
                               headers={"content-type": "application/json"})
            assert r.status_code == 404, (method, path, r.status_code, r.text)
            assert r.headers["content-type"] == "application/json"
            assert r.json()["error"]["code"] == "path_not_found", (method, path, r.text)
    assert [req for ss in tp.servers.values() for s in ss for req in s.requests] == []


def test_inference_paths_still_pass(two_pools: TwoPools) -> None:
    tp = two_pools
    with httpx.Client(timeout=10) as client:
        ok = client.post(tp.gateway.url("/v1/completions?x=1"),
                         json={"model": "llama-8b", "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200, ok.text
        chat = client.post(tp.gateway.url("/v1/chat/completions"),
                           json={"model": "qwen-7b", "max_tokens": 2,
                                 "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200, chat.text
        # An unknown model on an inference path is still a model error, not a path error.
        unknown = client.post(tp.gateway.url("/v1/completions"),
                              json={"model": "nope", "prompt": "hi"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
