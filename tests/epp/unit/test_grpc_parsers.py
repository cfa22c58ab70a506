"""``vllmgrpc-parser`` and ``vertexai-parser``: real gRPC request bodies through the director
and the ext_proc stream. The bodies are encoded here by hand from the protobuf wire format
(field numbers of vLLM's ``vllm_engine.proto`` and Vertex AI's ``prediction_service.proto``),
or with the generated ``google.api.httpbody_pb2``, never with the parsers' own classes."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import replace

import orjson
import pytest
from google.api import httpbody_pb2

from epp.config import build, parse_config
from epp.datastore import Datastore, EndpointView
from epp.datastore.models import WeightedModel
from epp.handlers.exchange import PickerExchange
from epp.requestcontrol import Director
from epp.requestcontrol.plugin import Response, ResponseComplete
from epp.requestcontrol.plugins import VertexAIParser, VllmGrpcParser
from epp.requestcontrol.response import Usage
from epp.scheduling import LLMRequest
from shared.errors import BadRequest
from shared.extproc import BodyMode, ExtProcServicer
from tests.epp.unit.test_director import store
from tests.support.inprocess import body_msgs, headers_msg, request_outcome, run_stream
from tests.support.protowire import frame, lfield, packed, varint, vfield

GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
EMBED = "/vllm.grpc.engine.VllmEngine/Embed"
VERTEX = "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions"


# -- bodies ------------------------------------------------------------------------------------


def generate_text(text: str, *, stream: bool = False) -> bytes:
    """GenerateRequest{request_id=1, text=3, sampling_params=4 {max_tokens=8}, stream=5}."""
    msg = lfield(1, b"req-1") + lfield(3, text.encode()) + lfield(4, vfield(8, 16))
    return frame(msg + (vfield(5, 1) if stream else b""))


def generate_tokens(ids: list[int]) -> bytes:
    """GenerateRequest{tokenized=2 {original_text=1, input_ids=2}}."""
    return frame(lfield(1, b"req-2") + lfield(2, lfield(1, b"txt") + packed(2, ids)))


def vertex_chat(chat: dict[str, object] | bytes, *, endpoint: str = "projects/p/endpoints/e",
                ) -> bytes:
    data = chat if isinstance(chat, bytes) else orjson.dumps(chat)
    body = httpbody_pb2.HttpBody(content_type="application/json", data=data)
    body.extensions.add().type_url = "type.googleapis.com/x.Extra"
    return frame(lfield(1, endpoint.encode()) + lfield(2, body.SerializeToString()))


def director(parser: str, ds: Datastore | None = None) -> Director:
    text = f"plugins:\n- type: {parser}\n- type: queue-scorer\nparser:\n  pluginRef: {parser}\n"
    return Director.of(build(parse_config(text), ds or store(), rng=random.Random(0)))


def headers(path: str) -> dict[str, str]:
    return {":path": path, "content-type": "application/grpc", "x-request-id": "r1"}


# -- vllmgrpc-parser ---------------------------------------------------------------------------


def test_vllm_generate_text_is_routed_with_its_prompt_and_body_unchanged() -> None:
    d = director("vllmgrpc-parser")
    decision, routed = d.route(headers(GENERATE), generate_text("hello world", stream=True), {})
    assert decision.body is None  # the protobuf body reaches the server byte for byte
    assert routed.request.prompt == b"hello world"
    assert routed.request.prompt_token_ids is None
    assert routed.endpoint is not None


def test_vllm_generate_stream_flag_is_read() -> None:
    p = VllmGrpcParser()
    assert p.parse(generate_text("x", stream=True), GENERATE).stream is True
    assert p.parse(generate_text("x"), GENERATE).stream is False


def test_vllm_tokenized_prompt_becomes_the_requests_token_ids() -> None:
    d = director("vllmgrpc-parser")
    ids = [1, 300, 70000, 5]
    _, routed = d.route(headers(GENERATE), generate_tokens(ids), {})
    assert list(routed.request.prompt_token_ids or ()) == ids
    assert routed.request.prompt_tokens == 4


def test_vllm_embed_reads_the_tokenized_input() -> None:
    req = VllmGrpcParser().parse(frame(lfield(2, packed(2, [7, 8, 9]))), EMBED)
    assert req.token_ids == [7, 8, 9] and req.kind.value == "embeddings"


def test_vllm_other_methods_pass_unread() -> None:
    d = director("vllmgrpc-parser")
    decision, routed = d.route(headers("/vllm.grpc.engine.VllmEngine/HealthCheck"),
                               frame(b""), {})
    assert decision.body is None and routed.request.prompt == b""


def test_vllm_rewrite_never_touches_the_protobuf_body() -> None:
    ds = store()
    ds.replace(replace(ds.snapshot, _match_all=(WeightedModel("other"),), _match_all_name="rw"))
    decision, _ = director("vllmgrpc-parser", ds).route(headers(GENERATE), generate_text("x"), {})
    assert decision.body is None


@pytest.mark.parametrize(("body", "words"), [
    (b"\x00\x00", "shorter than the 5-byte"),
    (frame(lfield(3, b"x"), flag=1), "compressed"),
    (frame(lfield(3, b"x"), flag=7), "compressed-flag 7"),
    (frame(lfield(3, b"x"))[:-1], "says 3 bytes but 2 follow"),
    (frame(lfield(3, b"x")) + frame(b""), "exactly one message"),
    (frame(b"\x1a\x09abc"), "not a valid vLLM GenerateRequest"),
    (frame(lfield(1, b"id-only")), "neither 'text' nor 'tokenized'"),
])
def test_vllm_malformed_bodies_are_400_saying_why(body: bytes, words: str) -> None:
    with pytest.raises(BadRequest) as e:
        VllmGrpcParser().parse(body, GENERATE)
    assert words in e.value.message and e.value.status == 400


def test_vllm_embed_without_tokenized_is_400() -> None:
    with pytest.raises(BadRequest, match="no 'tokenized'"):
        VllmGrpcParser().parse(frame(lfield(1, b"id")), EMBED)


def test_vllm_malformed_body_through_the_stream_is_an_openai_style_400() -> None:
    servicer = ExtProcServicer(lambda: PickerExchange(director("vllmgrpc-parser")),
                               request_mode=BodyMode.BUFFERED, response_mode=BodyMode.BUFFERED)
    out = run_stream(servicer, [headers_msg(list(headers(GENERATE).items())),
                                *body_msgs(b"\x00\x00\x00", [])])
    status, _, body = request_outcome(out)
    assert status == 400
    err = orjson.loads(body)["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_grpc_frame"
    assert "5-byte message header" in err["message"]


def test_vllm_usage_is_read_from_the_grpc_response_stream() -> None:
    """A streamed Generate through the ext_proc stream: chunks pass untouched, the final
    ``complete`` message's counts reach the response-complete plugins."""
    d = director("vllmgrpc-parser")
    seen: list[tuple[int, int, int]] = []

    class Recorder(ResponseComplete):
        def response_complete(self, request: LLMRequest, response: Response,
                              endpoint: EndpointView) -> None:
            seen.append((response.prompt_tokens, response.completion_tokens,
                         response.cached_tokens))

    d.runtime = dataclasses.replace(d.runtime, response_complete=(
        *d.runtime.response_complete, Recorder()))
    servicer = ExtProcServicer(lambda: PickerExchange(d),
                               request_mode=BodyMode.FULL_DUPLEX_STREAMED,
                               response_mode=BodyMode.FULL_DUPLEX_STREAMED)
    chunk = frame(lfield(1, packed(1, [11, 12])))  # GenerateStreamChunk without counts
    complete = frame(lfield(2, packed(1, [11, 12, 13]) + lfield(2, b"stop") + vfield(3, 40)
                            + vfield(4, 3) + vfield(5, 32)))
    response = chunk + complete
    out = run_stream(servicer, [
        headers_msg(list(headers(GENERATE).items())), *body_msgs(generate_text("hi"), []),
        headers_msg([(":status", "200"), ("content-type", "application/grpc")], response=True),
        *body_msgs(response, [3, len(chunk) + 4], response=True)])
    passed = b"".join(r.response_body.response.body_mutation.streamed_response.body
                      for r in out if r.HasField("response_body"))
    assert passed == response
    assert seen == [(40, 3, 32)]


# -- vertexai-parser ---------------------------------------------------------------------------

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_vertex_chat_is_read_like_openai_chat() -> None:
    req = VertexAIParser().parse(vertex_chat(CHAT), VERTEX)
    assert req.model == "m" and req.messages == CHAT["messages"] and req.stream


def test_vertex_chat_routes_on_its_messages_with_body_unchanged() -> None:
    decision, routed = director("vertexai-parser").route(headers(VERTEX), vertex_chat(CHAT), {})
    assert decision.body is None
    assert routed.request.prompt == orjson.dumps(CHAT["messages"])
    assert routed.request.client_model == "m"


def test_vertex_rewrite_re_encodes_the_same_grpc_message() -> None:
    ds = store()
    ds.replace(replace(ds.snapshot, _match_all=(WeightedModel("other"),), _match_all_name="rw"))
    decision, _ = director("vertexai-parser", ds).route(headers(VERTEX), vertex_chat(CHAT), {})
    assert decision.body is not None and decision.body[0] == 0
    assert int.from_bytes(decision.body[1:5], "big") == len(decision.body) - 5
    # ChatCompletionsRequest: endpoint = field 1, http_body = field 2 (read back by hand)
    msg = decision.body[5:]
    assert msg.startswith(lfield(1, b"projects/p/endpoints/e"))
    inner = msg[len(lfield(1, b"projects/p/endpoints/e")):]
    assert inner[0] == 0x12
    body = httpbody_pb2.HttpBody.FromString(inner[1 + len(varint(len(inner) - 2)):])
    assert orjson.loads(body.data) == {**CHAT, "model": "other"}
    assert body.content_type == "application/json"
    assert body.extensions[0].type_url == "type.googleapis.com/x.Extra"  # kept


@pytest.mark.parametrize(("body", "words"), [
    (frame(lfield(1, b"projects/p")), "has no 'http_body'"),
    (vertex_chat(b"{not json"), "not valid JSON"),
    (vertex_chat({"messages": []}), "no 'model' field"),
    (vertex_chat({"model": "m"}), "'messages' is required"),
    (frame(b"\x12\x05ab"), "not a valid Vertex AI ChatCompletionsRequest"),
    (b"{\"model\": \"m\"}", "compressed-flag 123"),
])
def test_vertex_malformed_bodies_are_400_saying_why(body: bytes, words: str) -> None:
    with pytest.raises(BadRequest) as e:
        VertexAIParser().parse(body, VERTEX)
    assert words in e.value.message and e.value.status == 400


def test_vertex_other_methods_pass_unread() -> None:
    path = "/google.cloud.aiplatform.v1.PredictionService/Predict"
    req = VertexAIParser().parse(b"anything", path)
    assert req.model == "" and req.body == {}


def test_vertex_usage_is_read_from_http_body_responses() -> None:
    usage = Usage()
    p = VertexAIParser()
    sse = b'data: {"choices":[]}\n\ndata: {"usage":{"prompt_tokens":9,"completion_tokens":4}}\n'
    p.read_response(VERTEX, httpbody_pb2.HttpBody(data=sse).SerializeToString(), usage)
    assert (usage.prompt_tokens, usage.completion_tokens) == (9, 4)
    whole = orjson.dumps({"usage": {"prompt_tokens": 2, "completion_tokens": 1}})
    p.read_response(VERTEX, httpbody_pb2.HttpBody(data=whole).SerializeToString(), usage)
    assert (usage.prompt_tokens, usage.completion_tokens) == (2, 1)
