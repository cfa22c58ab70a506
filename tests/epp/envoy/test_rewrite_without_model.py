"""A request without ``model`` goes to a match-all InferenceModelRewrite, which names the model
(llm-d-router v0.10, PR 1426); without such a rule it is still a 400. Through a real Envoy, a
real ``epp`` process reading the rewrite from its manifests, and real model servers."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.support.picker import OBJECTIVES, Pool, start_pool, start_servers
from tests.support.processes import BackgroundLoop

pytestmark = pytest.mark.envoy

MATCH_ALL = {
    "apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceModelRewrite",
    "metadata": {"name": "default-model", "namespace": "default"},
    "spec": {"poolRef": {"name": "pool"}, "rules": [
        {"targets": [{"modelRewrite": "base-model"}]}]},
}


@pytest.fixture(scope="module")
def match_all_pool(bg: BackgroundLoop,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    servers = start_servers(bg, 2)
    p = start_pool(bg, tmp_path_factory.mktemp("match-all"), servers,
                   extra=[MATCH_ALL, *OBJECTIVES])
    yield p
    p.envoy.stop()
    p.epp.stop()
    for s in servers:
        bg.run(s.stop())


@pytest.mark.parametrize("body", [{"prompt": "no model here"},
                                  {"model": "", "prompt": "an empty model"}])
def test_a_request_without_model_is_served_the_match_all_rewrites_model(
        match_all_pool: Pool, body: dict[str, str]) -> None:
    r = httpx.post(match_all_pool.url(), content=orjson.dumps(body), timeout=10)
    assert r.status_code == 200, r.text
    served = r.json()
    assert served["served_by"] in {s.name for s in match_all_pool.servers}
    server = next(s for s in match_all_pool.servers if s.name == served["served_by"])
    assert server.requests[-1]["body"]["model"] == "base-model"  # named in the body sent on
    assert served["model"] == "base-model"  # the response keeps the model that served it


def test_a_request_with_a_model_still_goes_by_its_model(match_all_pool: Pool) -> None:
    r = httpx.post(match_all_pool.url(), content=orjson.dumps(
        {"model": "other-model", "prompt": "x"}), timeout=10)
    assert r.status_code == 200
    assert r.json()["model"] == "other-model"  # rewritten to base-model, renamed back


def test_a_model_that_is_not_a_string_is_still_a_400(match_all_pool: Pool) -> None:
    r = httpx.post(match_all_pool.url(), content=orjson.dumps({"model": 7, "prompt": "x"}),
                   timeout=10)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_model"
