"""``vllmgrpc-parser``: reads requests to vLLM's gRPC engine API (``vllm.grpc.engine.VllmEngine``,
served over h2c): ``Generate`` and ``Embed``; every other method passes unread."""

from __future__ import annotations

from google.protobuf.descriptor_pb2 import FieldDescriptorProto
from google.protobuf.message import DecodeError

from epp.requestcontrol.grpcbody import (
    GrpcResponseReader,
    decode,
    field,
    message_classes,
    unframe,
)
from epp.requestcontrol.plugin import Parser
from epp.requestcontrol.response import Usage
from epp.scheduling.plugin import Plugin
from shared.errors import BadRequest
from shared.openai import ApiKind, OpenAIRequest

SERVICE = "/vllm.grpc.engine.VllmEngine/"
GENERATE = SERVICE + "Generate"
EMBED = SERVICE + "Embed"

_P = "vllm.grpc.engine"
_F = FieldDescriptorProto
_STR, _BOOL, _U32, _MSG = _F.TYPE_STRING, _F.TYPE_BOOL, _F.TYPE_UINT32, _F.TYPE_MESSAGE

#: The fields routing reads, with vLLM's field numbers (vllm_engine.proto, as upstream v1.5
#: vendors it). Sampling parameters and multimodal inputs are not declared: they stay in the
#: body, which is never re-encoded.
MESSAGES = message_classes(_P, {
    "TokenizedInput": [field("original_text", 1, _STR),
                       field("input_ids", 2, _U32, repeated=True)],
    "GenerateRequest": [field("request_id", 1, _STR),
                        field("tokenized", 2, _MSG, message=f"{_P}.TokenizedInput", oneof=0),
                        field("text", 3, _STR, oneof=0),
                        field("stream", 5, _BOOL)],
    "EmbedRequest": [field("request_id", 1, _STR),
                     field("tokenized", 2, _MSG, message=f"{_P}.TokenizedInput")],
    "GenerateStreamChunk": [field("token_ids", 1, _U32, repeated=True),
                            field("prompt_tokens", 2, _U32),
                            field("completion_tokens", 3, _U32),
                            field("cached_tokens", 4, _U32)],
    "GenerateComplete": [field("output_ids", 1, _U32, repeated=True),
                         field("finish_reason", 2, _STR),
                         field("prompt_tokens", 3, _U32),
                         field("completion_tokens", 4, _U32),
                         field("cached_tokens", 5, _U32)],
    "EmbedResponse": [field("embedding", 1, _F.TYPE_FLOAT, repeated=True),
                      field("prompt_tokens", 2, _U32),
                      field("embedding_dim", 3, _U32)],
    "GenerateResponse": [
        field("chunk", 1, _MSG, message=f"{_P}.GenerateStreamChunk", oneof=0),
        field("complete", 2, _MSG, message=f"{_P}.GenerateComplete", oneof=0)],
}, oneofs={"GenerateRequest": ["input"], "GenerateResponse": ["response"]})


class VllmGrpcParser(Plugin, Parser, GrpcResponseReader):
    """``:path`` picks the method. ``Generate``: the prompt is ``text``, or the token ids of
    ``tokenized`` (the request's ``prompt_token_ids``: prefix scoring hashes exact token
    blocks); ``stream`` as sent; 400 when neither input is
    set. ``Embed``: the token ids of ``tokenized``; 400 without. Other methods (health, model
    info, abort) pass unread. The API names no model (a vLLM gRPC server serves one), so
    no rewrite applies and the body always reaches the server byte for byte. Response
    messages give the token usage (``prompt_tokens``, ``completion_tokens``,
    ``cached_tokens``). Upstream's parser; upstream reads multimodal placeholders too, which
    nothing here uses."""

    type_name = "vllmgrpc-parser"
    paths = (GENERATE, EMBED)

    def parse(self, body: bytes, path: str) -> OpenAIRequest:
        method = path.split("?", 1)[0]
        if method == GENERATE:
            msg = decode(MESSAGES["GenerateRequest"], unframe(body), "vLLM GenerateRequest")
            which = msg.WhichOneof("input")
            if which is None:
                raise BadRequest("vLLM GenerateRequest has neither 'text' nor 'tokenized' input",
                                 code="invalid_body")
            if which == "text":
                return OpenAIRequest(kind=ApiKind.COMPLETIONS, model="",
                                     body={"prompt": msg.text, "stream": msg.stream})
            ids = list(msg.tokenized.input_ids)
            return OpenAIRequest(kind=ApiKind.COMPLETIONS, model="", token_ids=ids,
                                 body={"prompt": ids, "stream": msg.stream})
        if method == EMBED:
            msg = decode(MESSAGES["EmbedRequest"], unframe(body), "vLLM EmbedRequest")
            if not msg.HasField("tokenized"):
                raise BadRequest("vLLM EmbedRequest has no 'tokenized' input",
                                 code="invalid_body")
            ids = list(msg.tokenized.input_ids)
            return OpenAIRequest(kind=ApiKind.EMBEDDINGS, model="", token_ids=ids,
                                 body={"input": ids})
        return OpenAIRequest(kind=ApiKind.OTHER, body={}, model="")

    def read_response(self, path: str, message: bytes, usage: Usage) -> None:
        embed = path.split("?", 1)[0] == EMBED
        resp = MESSAGES["EmbedResponse" if embed else "GenerateResponse"]()
        try:
            resp.ParseFromString(message)
        except DecodeError:
            return
        if embed:
            if resp.prompt_tokens:
                usage.prompt_tokens = resp.prompt_tokens
            return
        which = resp.WhichOneof("response")
        if which is None:
            return
        part = getattr(resp, which)
        # Streamed chunks often carry no counts until the last one: keep what was read.
        if part.prompt_tokens or part.completion_tokens:
            usage.prompt_tokens = part.prompt_tokens
            usage.completion_tokens = part.completion_tokens
            usage.cached_tokens = part.cached_tokens


__all__ = ["EMBED", "GENERATE", "MESSAGES", "VllmGrpcParser"]
