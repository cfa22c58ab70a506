"""``vllmhttp-parser``: reads vLLM's token-in/token-out ``/inference/v1/generate`` bodies."""

from __future__ import annotations

from typing import Any

from epp.requestcontrol.plugin import Parser
from epp.scheduling.plugin import Plugin
from shared.errors import BadRequest
from shared.openai import ApiKind, OpenAIRequest, model_field, parse_json_object

GENERATE = "inference/v1/generate"
_U32 = 0xFFFFFFFF


def token_id_list(value: Any, field: str) -> list[int]:
    """``value`` as a non-empty list of token ids (integers in 0..2^32-1), else 400."""
    if not isinstance(value, list) or not value:
        raise BadRequest(f"'{field}' must be a non-empty list of token ids",
                         code="invalid_body")
    for i, t in enumerate(value):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t <= _U32:
            raise BadRequest(f"'{field}[{i}]' is not a token id: {t!r}", code="invalid_body")
    return value


class VllmHttpParser(Plugin, Parser):
    """``/inference/v1/generate``: the body must be a JSON object with a non-empty
    ``token_ids`` list of integers (400 otherwise). The ids are the prompt: prefix scoring
    hashes them directly and the prompt's token count is exact. ``model`` is optional (vLLM
    serves one model): when present it is rewritten and restored like OpenAI's; when absent
    a match-all InferenceModelRewrite names it, else 400, as for ``openai-parser``.
    ``sampling_params.max_tokens`` and ``stream`` are read. The response names no model;
    its usage is read from ``usage`` when vLLM sends it (streamed with
    ``stream_options.include_usage``), else the generated ``token_ids`` are counted. Claims
    only this path: list ``openai-parser`` too for OpenAI paths on the same route.
    Upstream's parser (llm-d-router v0.10, Beta)."""

    type_name = "vllmhttp-parser"
    paths = (GENERATE,)

    def parse(self, body: bytes, path: str) -> OpenAIRequest:
        data = parse_json_object(body)
        ids = token_id_list(data.get("token_ids"), "token_ids")
        absent = data.get("model") in (None, "")
        model = "" if absent else model_field(data)
        return GenerateRequest(kind=ApiKind.GENERATE, body=data, model=model,
                               token_ids=ids, model_absent=absent)


class GenerateRequest(OpenAIRequest):
    """A native generate body: the output cap lives in ``sampling_params``."""

    __slots__ = ()

    @property
    def prompt(self) -> Any:
        return self.token_ids if self.token_ids is not None else self.body.get("text")

    @property
    def limits(self) -> dict[str, Any]:
        sp = self.body.get("sampling_params")
        return sp if isinstance(sp, dict) else {}


__all__ = ["GENERATE", "GenerateRequest", "VllmHttpParser", "token_id_list"]
