"""A corpus of upstream-shaped EndpointPickerConfigs (written here from upstream's documented
fields, ``configs/*.yaml``): each document loads, or fails where upstream v1.5.0's loader
fails, or fails with "unknown plugin type" naming the issue that brings the type.

Each document starts with ``# expect: loads`` or ``# expect: error: <text>`` (the text must be
in the one-line error), optionally ``# expect-issue: #N``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.config import ConfigError, build, builtin_registry, parse_config
from epp.config.builtins import PENDING
from epp.config.loader import DATA_LAYER_KEYS, SECTIONS

CONFIGS = Path(__file__).parent / "configs"

#: Every plugin type upstream GIE v1.5.0 registers (cmd/epp/runner/runner.go and the
#: packages registering themselves) ...
GIE_V15_TYPES = frozenset({
    "prefix-cache-scorer", "max-score-picker", "random-picker", "weighted-random-picker",
    "single-profile-handler", "kv-cache-utilization-scorer", "queue-scorer",
    "running-requests-size-scorer", "lora-affinity-scorer", "token-load-scorer",
    "global-strict-fairness-policy", "round-robin-fairness-policy", "fcfs-ordering-policy",
    "edf-ordering-policy", "slo-deadline-ordering-policy", "static-usage-limit-policy",
    "approx-prefix-cache-producer", "predicted-latency-scorer", "predicted-latency-producer",
    "latency-slo-admitter", "prefix-cache-affinity-filter", "slo-headroom-tier-filter",
    "latency-scorer", "inflight-load-producer", "header-based-testing-filter",
    "destination-endpoint-served-verifier", "metrics-data-source", "core-metrics-extractor",
    "k8s-notification-source", "endpoint-notification-source", "request-attribute-reporter",
    "openai-parser", "vllmgrpc-parser", "passthrough-parser", "concurrency-detector",
    "utilization-detector", "eviction-sheddable-filter", "eviction-priority-then-time-ordering",
})
#: ... and every one the llm-d inference scheduler adds (pkg/epp/framework/plugins).
LLM_D_TYPES = frozenset({
    "label-selector-filter", "by-label-selector", "by-label", "encode-filter", "decode-filter",
    "prefill-filter", "disagg-headers-handler", "prefill-header-handler",
    "data-parallel-profile-handler", "disagg-profile-handler", "pd-profile-handler",
    "precise-prefix-cache-scorer", "load-aware-scorer", "session-affinity-scorer",
    "active-request-scorer", "no-hit-lru-scorer", "models-data-source", "models-data-extractor",
    "prefix-based-pd-decider", "always-disagg-pd-decider", "token-producer", "tokenizer",
    "always-disagg-multimodal-decider", "context-length-aware", "probabilistic-admitter",
    "vertexai-parser", "sheddable-eviction-filter", "priority-then-time-eviction-order-policy",
})
UPSTREAM_TYPES = GIE_V15_TYPES | LLM_D_TYPES


@dataclass(frozen=True)
class Case:
    file: str
    index: int
    text: str
    error: str | None
    issue: str | None

    @property
    def id(self) -> str:
        return f"{self.file}#{self.index}"

    def types(self) -> set[str]:
        try:
            doc = yaml.safe_load(self.text) or {}
        except yaml.YAMLError:
            return set()
        plugins = doc.get("plugins") if isinstance(doc, dict) else None
        return {p["type"] for p in plugins or [] if isinstance(p, dict) and "type" in p}


def cases() -> list[Case]:
    out = []
    for path in sorted(CONFIGS.glob("*.yaml")):
        for i, text in enumerate(re.split(r"(?m)^---$", path.read_text())):
            expect = re.search(r"(?m)^# expect: (loads|error: (.*))$", text)
            assert expect, f"{path.name} document {i} has no '# expect:' line"
            issue = re.search(r"(?m)^# expect-issue: (#\d+)$", text)
            out.append(Case(path.name, i, text, expect.group(2) and expect.group(2).strip(),
                            issue.group(1) if issue else None))
    return out


CASES = cases()


def outcome(case: Case) -> str | None:
    """None when the config builds, else the one-line error."""
    try:
        build(parse_config(case.text, source=case.id))
    except ConfigError as e:
        assert "\n" not in str(e)
        return str(e)
    return None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_upstream_config(case: Case) -> None:
    registry = builtin_registry()
    built_elsewhere = case.issue is not None and case.types() and all(
        t in registry.types for t in case.types())
    error = outcome(case)
    if built_elsewhere:
        # Another issue's branch has built the type since this corpus was written: the
        # config must no longer stop on "unknown plugin type" (its own tests say the rest).
        assert error is None or "unknown plugin type" not in error, error
        return
    if case.error is None:
        assert error is None, error
        return
    assert error is not None, f"{case.id} loaded; expected: {case.error}"
    assert case.error in error
    assert error.startswith(case.id)  # the message names where the config came from
    if case.issue is not None:
        assert f"issue {case.issue}" in error


def test_the_corpus_covers_every_upstream_plugin_type() -> None:
    seen = set().union(*(c.types() for c in CASES))
    assert UPSTREAM_TYPES - seen == set()


def test_every_upstream_type_is_built_or_names_its_issue() -> None:
    registry = builtin_registry()
    missing = UPSTREAM_TYPES - set(registry.types)
    assert missing - set(PENDING) == set()
    assert all(re.search(r"issue #\d+", PENDING[t]) for t in missing)


def _corpus_documents() -> list[dict[str, Any]]:
    """The corpus cases that parse to a mapping (the malformed ones are cases too)."""
    docs = []
    for c in CASES:
        try:
            doc = yaml.safe_load(c.text)
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


def test_the_corpus_covers_every_config_section() -> None:
    used: set[str] = set()
    for doc in _corpus_documents():
        used |= set(doc)
    assert set(SECTIONS) - used == set()


def test_the_corpus_covers_every_data_layer_key_and_request_handler() -> None:
    used: set[str] = set()
    for doc in _corpus_documents():
        used |= {f"dataLayer.{k}" for k in doc.get("dataLayer") or {}}
        used |= {f"requestHandler.{k}" for k in doc.get("requestHandler") or {}}
    wanted = {f"dataLayer.{k}" for k in DATA_LAYER_KEYS} | {"requestHandler.parsers"}
    assert wanted - used == set()
