"""``request-attribute-reporter``: a number computed from the response's ``usage`` by a CEL
expression, handed to the proxy as dynamic metadata (for cost-based rate limiting, billing,
observability), as upstream's plugin does::

    - type: request-attribute-reporter
      parameters:
        attributes:
        - key: {namespace: envoy.lb, name: x-gateway-inference-request-cost}
          expression: usage.prompt_tokens + usage.completion_tokens
          condition: has(usage.prompt_tokens) && has(usage.completion_tokens)

CEL (Common Expression Language) is evaluated by ``cel-python``; an expression is compiled
once, at config load, and costs a few hundred microseconds per response it runs on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
import structlog
from celpy import celtypes

from epp.requestcontrol.plugin import Response, ResponseMetadata
from epp.scheduling.plugin import Plugin
from epp.scheduling.request import LLMRequest

log = structlog.get_logger(__name__)

DEFAULT_NAMESPACE = "envoy.lb"


@dataclass(frozen=True, slots=True)
class AttributeKey:
    """Where the value goes: ``namespace`` (default ``envoy.lb``) and ``name``."""

    name: str = ""
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class Attribute:
    """``expression``: CEL over ``usage``, giving a number; ``condition``: optional CEL
    giving a boolean, the attribute is reported only when it is true."""

    key: AttributeKey = field(default_factory=AttributeKey)
    expression: str = ""
    condition: str = ""


@dataclass(frozen=True, slots=True)
class ReporterParameters:
    """``attributes``: exactly one entry, as upstream."""

    attributes: list[Attribute] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.attributes) != 1:
            raise ValueError("attributes must contain exactly one entry")
        a = self.attributes[0]
        if not a.key.name:
            raise ValueError("attributes[0].key.name must not be empty")
        if not a.expression:
            raise ValueError("attributes[0].expression must not be empty")


def _as_struct(value: Any) -> Any:
    """JSON as upstream's CEL sees it (a ``google.protobuf.Struct``): every number is a
    double, so ``usage.total_tokens * 1.5`` works as it does there."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _as_struct(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_struct(v) for v in value]
    return value


def _compile(env: celpy.Environment, text: str, what: str) -> Any:
    try:
        return env.program(env.compile(text))
    except celpy.CELParseError as e:
        raise ValueError(f"attributes[0].{what}: not valid CEL: "
                         f"{' '.join(str(e).split())}") from None


class RequestAttributeReporter(Plugin, ResponseMetadata):
    """At the response's end: if ``condition`` (when given) is true over ``usage``, the
    ``expression``'s value, truncated to an integer, goes to dynamic metadata
    ``namespace`` → ``name`` (a number). Zero, a non-number result or an evaluation error
    (a missing field without ``has()``) reports nothing; errors are logged."""

    type_name = "request-attribute-reporter"
    parameters_type = ReporterParameters
    params: ReporterParameters

    def __init__(self, name: str = "", params: Any = None) -> None:
        super().__init__(name, params)
        a = self.params.attributes[0]
        self.namespace = a.key.namespace or DEFAULT_NAMESPACE
        self.key = a.key.name
        env = celpy.Environment()
        self._expression = _compile(env, a.expression, "expression")
        self._condition = _compile(env, a.condition, "condition") if a.condition else None
        self._warned: set[str] = set()

    def value(self, usage: Mapping[str, Any]) -> int | None:
        """The number to report for ``usage`` (None: nothing to report)."""
        activation = {"usage": celpy.json_to_cel(_as_struct(usage))}
        try:
            if self._condition is not None:
                ok = self._condition.evaluate(activation)
                if not isinstance(ok, celtypes.BoolType) or not ok:
                    return None
            result = self._expression.evaluate(activation)
        except celpy.CELEvalError as e:
            self._warn_once("expression failed", str(e))
            return None
        if isinstance(result, bool | celtypes.BoolType) or not isinstance(result, int | float):
            self._warn_once("expression is not a number", str(result))
            return None
        value = int(float(result))
        return value or None

    def _warn_once(self, problem: str, detail: str) -> None:
        """Per-response failures are logged once per kind (not on every request)."""
        if problem not in self._warned:
            self._warned.add(problem)
            log.warning(f"request-attribute-reporter: {problem} (logged once)",
                        plugin=self.name, detail=detail[:300])

    def response_metadata(self, request: LLMRequest, response: Response,
                          usage: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]] | None:
        value = self.value(usage)
        return None if value is None else {self.namespace: {self.key: value}}
