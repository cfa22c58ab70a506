"""``vertexai-parser``: reads Vertex AI's gRPC ``PredictionService/ChatCompletions`` (an
OpenAI chat body inside a ``google.api.HttpBody``); every other method passes unread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as _F
from google.protobuf.message import DecodeError

from epp.requestcontrol.grpcbody import (
    GrpcResponseReader,
    decode,
    field,
    frame,
    message_classes,
    unframe,
)
from epp.requestcontrol.plugin import Parser
from epp.requestcontrol.response import Usage
from epp.scheduling.plugin import Plugin
from shared.errors import BadRequest
from shared.openai import ApiKind, OpenAIRequest, parse_request

#: Suffix of the method path (any version: ``/google.cloud.aiplatform.v1beta1.`` + this).
CHAT_COMPLETIONS = "PredictionService/ChatCompletions"

_P = "google.cloud.aiplatform.subset"
#: Field numbers of ``aiplatform.v1beta1.ChatCompletionsRequest`` and ``google.api.HttpBody``
#: (``extensions`` is not declared: kept as an unknown field, so it survives a re-encode).
MESSAGES = message_classes(_P, {
    "HttpBody": [field("content_type", 1, _F.TYPE_STRING), field("data", 2, _F.TYPE_BYTES)],
    "ChatCompletionsRequest": [field("endpoint", 1, _F.TYPE_STRING),
                               field("http_body", 2, _F.TYPE_MESSAGE, message=f"{_P}.HttpBody")],
})


@dataclass(slots=True)
class VertexChatRequest(OpenAIRequest):
    """The chat body of a ChatCompletionsRequest; re-encoded as the same gRPC message."""

    message: Any = None

    def dumps(self) -> bytes:
        self.message.http_body.data = orjson.dumps(self.body)
        return frame(self.message.SerializeToString())


class VertexAIParser(Plugin, Parser, GrpcResponseReader):
    """``ChatCompletions``: the ``http_body.data`` must be an OpenAI chat request (JSON
    object, string ``model``, list ``messages``), read exactly as ``openai-parser`` reads
    ``/v1/chat/completions``; 400 when the frame, the message or the JSON is bad or
    ``http_body`` is missing. A model rewrite re-encodes the message with the new model.
    Other Vertex AI methods pass unread (routed by load, as upstream). Response messages
    (``HttpBody`` with JSON or SSE data) give the token usage. As upstream (llm-d)."""

    type_name = "vertexai-parser"
    paths = (CHAT_COMPLETIONS, "PredictionService/StreamRawPredict",
             "PredictionService/RawPredict")

    def parse(self, body: bytes, path: str) -> OpenAIRequest:
        if not path.split("?", 1)[0].endswith(CHAT_COMPLETIONS):
            return OpenAIRequest(kind=ApiKind.OTHER, body={}, model="")
        msg = decode(MESSAGES["ChatCompletionsRequest"], unframe(body),
                     "Vertex AI ChatCompletionsRequest")
        if not msg.HasField("http_body"):
            raise BadRequest("Vertex AI ChatCompletionsRequest has no 'http_body'",
                             code="invalid_body")
        chat = parse_request(msg.http_body.data, "/chat/completions")
        return VertexChatRequest(kind=chat.kind, body=chat.body, model=chat.model, message=msg)

    def read_response(self, path: str, message: bytes, usage: Usage) -> None:
        resp = MESSAGES["HttpBody"]()
        try:
            resp.ParseFromString(message)
        except DecodeError:
            return
        for line in resp.data.splitlines():
            text = line.removeprefix(b"data:").strip()
            if not text.startswith(b"{"):
                continue
            try:
                data = orjson.loads(text)
            except orjson.JSONDecodeError:
                continue
            if isinstance(data, dict) and data.get("usage"):
                usage.read(data["usage"])


__all__ = ["CHAT_COMPLETIONS", "MESSAGES", "VertexAIParser", "VertexChatRequest"]
