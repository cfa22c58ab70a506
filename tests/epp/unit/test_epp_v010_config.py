"""llm-d v0.10's configuration API here: ``requestHandler.parsers`` (the first parser that
claims a request's path parses it), ``dataLayer.injectDefaults``, deprecated plugin types
(loaded with one warning while v0.10 still registers them), plugin stability levels, the
approximate producer's ``maxPrefixTokensToMatch`` and the scorer's ``matchLengthWeight``."""

from __future__ import annotations

import orjson
import pytest
from structlog.testing import capture_logs

from epp.config import ConfigError, build, parse_config
from epp.config.stability import (
    ALPHA_TYPES,
    DEPRECATED,
    V010_TYPES,
    ExperimentalPluginError,
    check_stability,
)
from epp.requestcontrol.parser_chain import ParserChain
from epp.scheduling.plugins.prefix.prefix_cache_scorer import PrefixCacheScorer
from epp.scheduling.plugins.prefix.producer import ApproxPrefixCacheProducer
from epp.scheduling.request import LLMRequest
from shared.errors import NotFound
from shared.openai import ApiKind
from tests.support.views import build_view

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def parsers(refs: str, extra: str = "") -> ParserChain:
    text = f"""\
plugins:
- {{name: grpc, type: vllmgrpc-parser}}
- {{name: openai, type: openai-parser}}
- {{name: raw, type: passthrough-parser}}
- {{name: vertex, type: vertexai-parser}}
{extra}requestHandler:
  parsers: [{refs}]
"""
    chain = build(parse_config(text)).parser
    assert isinstance(chain, ParserChain)
    return chain


def test_the_first_parser_claiming_the_path_parses_the_request() -> None:
    chain = parsers("{pluginRef: grpc}, {pluginRef: openai}, {pluginRef: raw}")
    assert chain.resolve("/vllm.grpc.engine.VllmEngine/Generate").type_name == "vllmgrpc-parser"
    assert chain.resolve("/v1/chat/completions?x=1").type_name == "openai-parser"
    assert chain.resolve("/v1/completions/").type_name == "openai-parser"
    # Nobody claims it: the parser claiming no path (passthrough) takes it.
    assert chain.resolve("/custom/api").type_name == "passthrough-parser"
    assert chain.parse(CHAT, "/v1/chat/completions").kind is ApiKind.CHAT
    assert chain.parse(b"not json", "/custom/api").kind is ApiKind.OTHER


def test_a_path_nobody_claims_is_404_without_a_fallback() -> None:
    chain = parsers("{pluginRef: grpc}, {pluginRef: openai}")
    with pytest.raises(NotFound, match=r"no parser is configured for path '/custom/api'"):
        chain.parse(b"{}", "/custom/api")


def test_parsers_after_the_fallback_are_never_used() -> None:
    with capture_logs() as logs:
        chain = parsers("{pluginRef: raw}, {pluginRef: openai}")
    assert chain.resolve("/v1/chat/completions").type_name == "passthrough-parser"
    assert any(e["event"].startswith("parser listed after a fallback") for e in logs)


def test_one_listed_parser_is_used_as_is_and_beats_the_older_parser_section() -> None:
    text = """\
plugins: [{name: grpc, type: vllmgrpc-parser}, {name: openai, type: openai-parser}]
parser: {pluginRef: openai}
requestHandler: {parsers: [{pluginRef: grpc}]}
"""
    assert build(parse_config(text)).parser.type_name == "vllmgrpc-parser"  # type: ignore


def test_default_metrics_source_is_injected_beside_listed_sources() -> None:
    text = """\
plugins: [{type: models-data-source}, {type: models-data-extractor}]
dataLayer:
  sources: [{pluginRef: models-data-source, extractors: [{pluginRef: models-data-extractor}]}]
"""
    types = [s.type_name for s in build(parse_config(text)).data_sources]
    assert types == ["models-data-source", "metrics-data-source"]
    off = text + "  injectDefaults: false\n"
    assert [s.type_name for s in build(parse_config(off)).data_sources] == [
        "models-data-source"]


def test_cross_replica_sync_interval_is_read_and_a_syncer_ref_is_refused() -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        cfg = parse_config("dataLayer: {crossReplicaSyncInterval: 1m30s}\n")
    assert cfg.cross_replica_sync_interval == 90.0
    # it does nothing without a syncer, and says so
    assert [e["log_level"] for e in logs if "crossReplicaSyncInterval" in e["event"]] == [
        "warning"]
    with pytest.raises(ConfigError, match="no plugin named 'x' in plugins"):
        parse_config("dataLayer: {crossReplicaSyncerPluginRef: x}\n")


@pytest.mark.parametrize("type_name", sorted(DEPRECATED))
def test_each_deprecated_type_still_registered_upstream_warns_once(type_name: str) -> None:
    from epp.config.stability import warn_deprecated

    with capture_logs() as logs:
        assert warn_deprecated(type_name, "p", "cfg: plugins[0]")
    (entry,) = logs
    assert entry["event"] == "plugin type is deprecated"
    assert entry["use"] == DEPRECATED[type_name].replacement


def test_building_a_deprecated_type_warns_and_its_replacement_does_not() -> None:
    old = "plugins: [{type: by-label, parameters: {label: llm-d.ai/role, validValues: [x]}}]\n"
    with capture_logs() as logs:
        build(parse_config(old, source="old.yaml"))
    warned = [e for e in logs if e["event"] == "plugin type is deprecated"]
    assert [(e["type"], e["use"], e["where"]) for e in warned] == [
        ("by-label", "label-selector-filter", "old.yaml: plugins[0]")]
    new = "plugins: [{type: label-selector-filter, parameters: {matchLabels: {a: b}}}]\n"
    with capture_logs() as logs:
        build(parse_config(new))
    assert not [e for e in logs if e["event"] == "plugin type is deprecated"]


def test_stability_tables_hold_only_types_upstream_registers() -> None:
    assert ALPHA_TYPES <= V010_TYPES
    assert set(DEPRECATED) <= V010_TYPES


def test_an_alpha_plugin_is_refused_unless_experimental_plugins_are_allowed() -> None:
    plugins = [("affinity", "session-affinity-scorer"), ("q", "queue-scorer")]
    with pytest.raises(ExperimentalPluginError, match=r"'affinity'.*Alpha"):
        check_stability(plugins, allow_experimental=False)
    check_stability(plugins, allow_experimental=True)
    check_stability([("q", "queue-scorer"), ("mine", "my-own-scorer")],
                    allow_experimental=False)


def prompt_request(n_tokens: int) -> LLMRequest:
    return LLMRequest("r", "m", prompt_token_ids=list(range(n_tokens)))


def producer(text: str) -> ApproxPrefixCacheProducer:
    rt = build(parse_config(f"plugins:\n- type: approx-prefix-cache-producer\n"
                            f"  parameters: {text}\n"))
    return rt.handle.plugin("approx-prefix-cache-producer", ApproxPrefixCacheProducer)


def test_max_prefix_tokens_to_match_caps_the_hashed_blocks() -> None:
    req = prompt_request(16 * 100)
    assert len(producer("{blockSizeTokens: 16}").block_hashes(req)) == 100
    capped = producer("{blockSizeTokens: 16, maxPrefixTokensToMatch: 320}")
    assert len(capped.block_hashes(req)) == 20  # 320 tokens / 16
    blocks = producer("{blockSizeTokens: 16, maxPrefixTokensToMatch: 0, "
                      "maxPrefixBlocksToMatch: 7}")
    assert len(blocks.block_hashes(req)) == 7  # 0 tokens: the block cap applies
    whole = producer("{blockSizeTokens: 16, maxPrefixTokensToMatch: 0, "
                     "maxPrefixBlocksToMatch: 0}")
    assert len(whole.block_hashes(prompt_request(16 * 3000))) == 3000  # both 0: no cap


def test_match_length_weight_blends_length_into_the_ratio() -> None:
    text = """\
plugins:
- {type: approx-prefix-cache-producer, parameters: {blockSizeTokens: 16}}
- name: s
  type: prefix-cache-scorer
  parameters: {matchLengthWeight: 0.25, matchLengthScaleTokens: 128}
"""
    rt = build(parse_config(text))
    scorer = rt.handle.plugin("s", PrefixCacheScorer)
    a, b = build_view("10.0.0.1:8000"), build_view("10.0.0.2:8000")
    seen = prompt_request(16 * 4)  # four blocks, recorded on a
    scorer.producer.record(seen, a)
    req = LLMRequest("r2", "m", prompt_token_ids=list(range(16 * 4)) + [9] * 16 * 4)
    # a: 4 of 8 blocks; length min(1, 4 x 16 / 128) = 0.5.
    assert list(scorer.score(req, [a, b])) == [0.25 * 0.5**2 + 0.75 * 0.5, 0.0]


def test_an_endpoints_file_skips_bad_entries_and_refuses_a_bad_file() -> None:
    from epp.sources.file_discovery import DiscoveryError, parse_endpoints

    text = b"""\
endpoints:
- {name: a, address: 10.0.0.1, port: "8000", labels: {llm-d.ai/role: decode}}
- {name: b, address: not-an-ip, port: "8000"}
- {name: c, address: 10.0.0.3, port: "70000"}
- {name: a, address: 10.0.0.4, port: 8000}
- {name: d, namespace: other, address: 10.0.0.5, port: 8001}
"""
    with capture_logs() as logs:
        eps = parse_endpoints(text, "f.yaml", "default")
    assert [(e.key, e.namespace, e.labels) for e in eps] == [
        ("10.0.0.1:8000", "default", {"llm-d.ai/role": "decode"}),
        ("10.0.0.5:8001", "other", {})]
    assert len([x for x in logs if x["event"].startswith("skipping")]) == 3
    with pytest.raises(DiscoveryError, match=r"f\.yaml: must be a mapping with one key"):
        parse_endpoints(b"pods: []\n", "f.yaml", "default")
    with pytest.raises(DiscoveryError, match="larger than"):
        parse_endpoints(b"#" * ((1 << 20) + 1), "f.yaml", "default")


def test_the_older_group_and_parser_section_load_with_a_deprecation_warning() -> None:
    text = ("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
            "plugins: [{type: openai-parser}]\nparser: {pluginRef: openai-parser}\n")
    with capture_logs() as logs:
        parse_config(text, source="old.yaml")
    assert sorted((e["where"], e["use"]) for e in logs) == [
        ("old.yaml: apiVersion", "llm-d.ai/v1alpha1"),
        ("old.yaml: parser", "requestHandler.parsers")]
    with capture_logs() as logs:
        parse_config("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n")
        parse_config(None)  # the built-in default says nothing
    assert logs == []
