"""``sglanghttp-parser``: reads SGLang's native ``/generate`` bodies (text or token ids)."""

from __future__ import annotations

from epp.requestcontrol.plugin import Parser
from epp.requestcontrol.plugins.vllmhttp_parser import GenerateRequest, token_id_list
from epp.scheduling.plugin import Plugin
from shared.errors import BadRequest
from shared.openai import ApiKind, OpenAIRequest, model_field, parse_json_object

GENERATE = "generate"


class SglangHttpParser(Plugin, Parser):
    """``/generate``: the body must be a JSON object with exactly one of ``text`` (a string)
    or ``input_ids`` (a non-empty list of token ids); 400 otherwise. Token ids are the
    prompt as they are (prefix scoring hashes them, the token count is exact); text is hashed
    as bytes like a completions prompt. A batch (a list of texts or of id lists) is routed as
    one request: prefix scoring reads its first prompt. SGLang's body has no ``model``
    (a server serves one; ``lora_path`` picks an adapter): a body without one is routed
    without rewrite, and when a client adds ``model`` anyway it is rewritten like OpenAI's.
    ``sampling_params.max_new_tokens`` and ``stream`` are read; usage comes from the
    response's ``meta_info`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``).
    Not an upstream type (llm-d-router v0.10 has no SGLang HTTP parser): ours. Its suffix
    ``generate`` also ends ``/inference/v1/generate``: list ``vllmhttp-parser`` first when
    both serve one route."""

    type_name = "sglanghttp-parser"
    paths = (GENERATE,)

    def parse(self, body: bytes, path: str) -> OpenAIRequest:
        data = parse_json_object(body)
        text, ids = data.get("text"), data.get("input_ids")
        if (text is None) == (ids is None):
            raise BadRequest("exactly one of 'text' or 'input_ids' is required for "
                             "generate requests", code="invalid_body")
        model = "" if data.get("model") in (None, "") else model_field(data)
        if ids is not None:
            first = ids[0] if isinstance(ids, list) and ids and isinstance(ids[0], list) \
                else ids
            tokens = token_id_list(first, "input_ids")
            return GenerateRequest(kind=ApiKind.GENERATE, body=data, model=model,
                                   token_ids=tokens)
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            text = text[0]
        if not isinstance(text, str):
            raise BadRequest("'text' must be a string or a list of strings",
                             code="invalid_body")
        return GenerateRequest(kind=ApiKind.GENERATE, body=data, model=model)


__all__ = ["GENERATE", "SglangHttpParser"]
