"""``anthropic-parser``, ``vllmhttp-parser`` and ``sglanghttp-parser`` through the director
(rewrite, token ids, output cap), the default parser list, and usage read from each API's
responses (bodies written here by hand in each API's documented shape)."""

from __future__ import annotations

import random
from dataclasses import replace

import orjson
import pytest

from epp.config import build, parse_config
from epp.datastore import Datastore
from epp.datastore.models import WeightedModel
from epp.requestcontrol import Director
from epp.requestcontrol.parser_chain import ParserChain
from epp.requestcontrol.plugins import AnthropicParser, SglangHttpParser, VllmHttpParser
from epp.requestcontrol.response import ResponseRewriter
from shared.errors import BadRequest, for_path
from tests.epp.unit.test_director import store

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
VLLM = "/inference/v1/generate"
SGLANG = "/generate"


def director(parsers: str = "", ds: Datastore | None = None) -> Director:
    text = "plugins:\n- type: queue-scorer\n" + parsers
    return Director.of(build(parse_config(text), ds or store(), rng=random.Random(0)))


def rewriting_store(target: str = "other") -> Datastore:
    ds = store()
    ds.replace(replace(ds.snapshot, _match_all=(WeightedModel(target),), _match_all_name="rw"))
    return ds


def hdrs(path: str) -> dict[str, str]:
    return {":path": path, "content-type": "application/json", "x-request-id": "r1"}


# -- the default list ------------------------------------------------------------------------


def test_default_parsers_are_upstreams_three_with_openai_taking_the_rest() -> None:
    chain = build(parse_config("plugins: [{type: queue-scorer}]\n")).parser
    assert isinstance(chain, ParserChain)
    assert chain.resolve(MESSAGES).type_name == "anthropic-parser"
    assert chain.resolve(COUNT).type_name == "anthropic-parser"
    assert chain.resolve(VLLM).type_name == "vllmhttp-parser"
    assert chain.resolve("/v1/chat/completions").type_name == "openai-parser"
    assert chain.resolve("/v1/custom").type_name == "openai-parser"


def test_vllmhttp_listed_first_keeps_its_path_from_sglangs_generate_suffix() -> None:
    text = """\
plugins: [{type: queue-scorer}, {name: v, type: vllmhttp-parser},
          {name: s, type: sglanghttp-parser}]
requestHandler: {parsers: [{pluginRef: v}, {pluginRef: s}]}
"""
    chain = build(parse_config(text)).parser
    assert isinstance(chain, ParserChain)
    assert chain.resolve(VLLM).type_name == "vllmhttp-parser"
    assert chain.resolve(SGLANG).type_name == "sglanghttp-parser"


# -- anthropic-parser --------------------------------------------------------------------------


def test_anthropic_messages_are_rewritten_with_system_first_in_the_prefix() -> None:
    body = {"model": "m", "max_tokens": 64, "system": "be brief", "stream": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    decision, routed = director(ds=rewriting_store()).route(hdrs(MESSAGES),
                                                            orjson.dumps(body), {})
    assert decision.body is not None and orjson.loads(decision.body)["model"] == "other"
    r = routed.request
    assert r.client_model == "m" and r.target_model == "other"
    assert r.stream is True and r.max_output_tokens == 64
    assert r.prompt.index(b"be brief") < r.prompt.index(b"hi")


def test_anthropic_count_tokens_passes_unread_and_unchanged() -> None:
    decision, routed = director(ds=rewriting_store()).route(hdrs(COUNT), b"{not json", {})
    assert decision.body is None and routed.request.prompt == b""


@pytest.mark.parametrize(("body", "words"), [
    (b"[]", "must be a JSON object"),
    (b"{oops", "not valid JSON"),
    (b'{"model": "m"}', "'messages' must be a non-empty list"),
    (b'{"model": "m", "messages": []}', "'messages' must be a non-empty list"),
    (b'{"model": 3, "messages": [{"role": "user", "content": "x"}]}', "must be a string"),
])
def test_anthropic_malformed_bodies_are_400_saying_why(body: bytes, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        AnthropicParser().parse(body, MESSAGES)


def test_errors_on_anthropic_paths_use_anthropics_envelope() -> None:
    err = for_path(BadRequest("bad", code="invalid_body"), "/v1/messages?beta=true")
    assert err.to_json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "bad", "code": "invalid_body"}}
    assert for_path(BadRequest("bad"), "/v1/chat/completions").to_json()["error"]["type"] \
        == "invalid_request_error"
    assert "type" not in for_path(BadRequest("bad"), "/v1/chat/completions").to_json()


def test_anthropic_usage_from_message_start_and_message_delta() -> None:
    rw = ResponseRewriter("m", "other")
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "other", "content": [],
        "usage": {"input_tokens": 25, "output_tokens": 1, "cache_read_input_tokens": 16}}}
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
             "usage": {"output_tokens": 15}}
    sse = (b"event: message_start\ndata: " + orjson.dumps(start) + b"\n\n"
           b"event: message_delta\ndata: " + orjson.dumps(delta) + b"\n\n")
    out = rw.chunk(sse[:50], False) + rw.chunk(sse[50:], True)
    assert b'"model":"m"' in out and b'"other"' not in out
    u = rw.usage
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (25, 15, 16)


def test_anthropic_json_usage_and_model_restored() -> None:
    rw = ResponseRewriter("m", "other")
    out = rw.body(orjson.dumps({"type": "message", "model": "other", "content": [],
                                "usage": {"input_tokens": 7, "output_tokens": 3}}))
    assert orjson.loads(out)["model"] == "m"
    assert (rw.usage.prompt_tokens, rw.usage.completion_tokens) == (7, 3)


# -- vllmhttp-parser ---------------------------------------------------------------------------


def test_vllm_generate_token_ids_are_the_prompt_and_the_model_is_rewritten() -> None:
    ids = [1, 300, 70000, 5]
    body = {"model": "m", "token_ids": ids, "sampling_params": {"max_tokens": 9}}
    decision, routed = director(ds=rewriting_store()).route(hdrs(VLLM), orjson.dumps(body), {})
    assert decision.body is not None
    sent = orjson.loads(decision.body)
    assert sent["model"] == "other" and sent["token_ids"] == ids
    assert list(routed.request.prompt_token_ids or ()) == ids
    assert routed.request.prompt_tokens == 4 and routed.request.max_output_tokens == 9


def test_vllm_generate_without_model_and_without_match_all_rule_is_400() -> None:
    with pytest.raises(BadRequest, match="no 'model' field"):
        director().route(hdrs(VLLM), b'{"token_ids": [1, 2]}', {})


@pytest.mark.parametrize(("body", "words"), [
    (b"{", "not valid JSON"),
    (b'{"model": "m"}', "'token_ids' must be a non-empty list"),
    (b'{"token_ids": []}', "'token_ids' must be a non-empty list"),
    (b'{"token_ids": [1, -2]}', r"'token_ids\[1\]' is not a token id"),
    (b'{"token_ids": [1, 4294967296]}', "is not a token id"),
    (b'{"token_ids": [1, "2"]}', "is not a token id"),
    (b'{"token_ids": [true]}', "is not a token id"),
])
def test_vllm_generate_malformed_bodies_are_400_saying_why(body: bytes, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        VllmHttpParser().parse(body, VLLM)


def test_vllm_generate_response_without_usage_counts_generated_ids() -> None:
    rw = ResponseRewriter("m", "m")
    rw.body(orjson.dumps({"request_id": "r", "choices": [
        {"index": 0, "token_ids": [5, 6, 7], "finish_reason": "length"}]}))
    assert rw.usage.completion_tokens == 3 and rw.usage.raw is None


# -- sglanghttp-parser -------------------------------------------------------------------------


def test_sglang_input_ids_are_used_directly_and_no_model_means_no_rewrite() -> None:
    body = {"input_ids": [9, 8, 7], "sampling_params": {"max_new_tokens": 12}, "stream": True}
    d = Director.of(build(parse_config(
        "plugins: [{type: queue-scorer}, {type: sglanghttp-parser}]\n"
        "parser: {pluginRef: sglanghttp-parser}\n"), store(), rng=random.Random(0)))
    decision, routed = d.route(hdrs(SGLANG), orjson.dumps(body), {})
    assert decision.body is None  # nothing to rewrite: the body reaches SGLang unchanged
    r = routed.request
    assert list(r.prompt_token_ids or ()) == [9, 8, 7] and r.prompt_tokens == 3
    assert r.max_output_tokens == 12 and r.stream is True


def test_sglang_text_is_the_prompt() -> None:
    req = SglangHttpParser().parse(b'{"text": ["abc", "def"]}', SGLANG)
    assert req.token_ids is None and req.model == ""


@pytest.mark.parametrize(("body", "words"), [
    (b"nope", "not valid JSON"),
    (b"{}", "exactly one of 'text' or 'input_ids'"),
    (b'{"text": "a", "input_ids": [1]}', "exactly one of"),
    (b'{"text": 5}', "'text' must be a string"),
    (b'{"input_ids": [1, -1]}', "is not a token id"),
])
def test_sglang_malformed_bodies_are_400_saying_why(body: bytes, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        SglangHttpParser().parse(body, SGLANG)


def test_sglang_usage_from_meta_info_streamed_and_not() -> None:
    meta = {"id": "x", "prompt_tokens": 11, "completion_tokens": 4, "cached_tokens": 8,
            "finish_reason": {"type": "length"}}
    rw = ResponseRewriter("", "")
    rw.body(orjson.dumps({"text": "abcd", "meta_info": meta}))
    assert (rw.usage.prompt_tokens, rw.usage.completion_tokens, rw.usage.cached_tokens) == (
        11, 4, 8)
    rw = ResponseRewriter("", "")
    rw.chunk(b"data: " + orjson.dumps({"text": "ab", "meta_info": {**meta,
                                                                    "completion_tokens": 2}})
             + b"\n\ndata: " + orjson.dumps({"text": "abcd", "meta_info": meta})
             + b"\n\ndata: [DONE]\n\n", True)
    assert (rw.usage.prompt_tokens, rw.usage.completion_tokens) == (11, 4)


# -- prefix scoring reads each protocol's prompt ------------------------------------------------

IDS = list(range(1000, 1256))


@pytest.mark.parametrize(("path", "first", "second"), [
    (VLLM, {"model": "m", "token_ids": IDS}, {"model": "m", "token_ids": [*IDS, 7, 8]}),
    (SGLANG, {"input_ids": IDS}, {"input_ids": [*IDS, 9]}),
    (MESSAGES, {"model": "m", "system": "s" * 2000, "messages": [{"role": "user",
                                                                  "content": "a"}]},
     {"model": "m", "system": "s" * 2000, "messages": [{"role": "user", "content": "a"},
                                                       {"role": "user", "content": "b"}]}),
], ids=["vllm-token-ids", "sglang-input-ids", "anthropic"])
def test_prefix_scoring_follows_each_protocols_prompt(path: str, first: dict,
                                                      second: dict) -> None:
    from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer

    text = ("plugins: [{type: sglanghttp-parser}, {type: vllmhttp-parser}, "
            "{type: anthropic-parser}, {type: prefix-cache-scorer,"
            " parameters: {blockSizeTokens: 16}}]\n"
            "requestHandler: {parsers: [{pluginRef: vllmhttp-parser}, "
            "{pluginRef: sglanghttp-parser}, {pluginRef: anthropic-parser}]}\n")
    d = Director.of(build(parse_config(text), store(), rng=random.Random(0)))
    (producer,) = d.runtime.handle.find(ApproxPrefixCacheProducer)
    _, a = d.route(hdrs(path), orjson.dumps(first), {})
    d.finish(a, completed=True, status=200, response_size=1, prompt_tokens=1,
             completion_tokens=1)
    assert producer.indexer_size > 0
    _, b = d.route(hdrs(path), orjson.dumps(second), {})
    match = producer.match(b.request)
    # Token ids (vLLM, SGLang) are hashed as token blocks: all 256 ids (16 blocks) matched.
    tokenized = "token_ids" in first or "input_ids" in first
    assert match.tokens is tokenized
    assert b.endpoint is a.endpoint
    if tokenized:
        assert match.matched[a.endpoint.key] == 16
    else:  # the first request's templated system + message bytes
        assert match.matched[a.endpoint.key] > 0
