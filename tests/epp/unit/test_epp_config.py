"""EndpointPickerConfig loading: defaults, upstream files, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.config import (
    ConfigError,
    build_saturation_detector,
    build_scheduler,
    load_config_file,
    parse_config,
    parse_duration,
)
from epp.scheduling.plugins import MaxScorePicker, PrefixCacheScorer, SingleProfileHandler

UPSTREAM = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: single-profile-handler
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 5
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
featureGates:
- prepareDataPlugins
saturationDetector:
  queueDepthThreshold: 5
  kvCacheUtilThreshold: 0.8
  metricsStalenessThreshold: 200ms
"""


def weights(text: str | None) -> dict[str, float]:
    s = build_scheduler(parse_config(text))
    (profile,) = s.profiles.values()
    return {ws.scorer.type_name: ws.weight for ws in profile.scorers}


UPSTREAM_DEFAULT = {"queue-scorer": 2, "kv-cache-utilization-scorer": 2,
                    "prefix-cache-scorer": 3}


def test_silent_config_gives_the_upstream_default_profile_and_prefill_load() -> None:
    """docs/epp.md, "The default profile": upstream's three scorers, plus ours."""
    assert weights(None) == {**UPSTREAM_DEFAULT, "prefill-load-scorer": 1}


def test_silent_config_uses_single_profile_handler_and_max_score_picker() -> None:
    s = build_scheduler(parse_config(None))
    assert isinstance(s.handler, SingleProfileHandler)
    assert isinstance(s.profiles["default"].picker, MaxScorePicker)


def test_upstream_config_loads_unchanged() -> None:
    assert weights(UPSTREAM) == UPSTREAM_DEFAULT


def test_llm_d_api_version_is_accepted() -> None:
    text = UPSTREAM.replace("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1")
    assert weights(text) == UPSTREAM_DEFAULT


def test_plugin_parameters_reach_the_plugin() -> None:
    s = build_scheduler(parse_config(UPSTREAM.replace("lruCapacityPerServer: 31250",
                                                      "lruCapacityPerServer: 99")))
    prefix = next(p for p in s.plugins if isinstance(p, PrefixCacheScorer))
    assert prefix.params.lru_capacity_per_server == 99


def test_saturation_detector_section_is_read() -> None:
    det = build_saturation_detector(parse_config(UPSTREAM.replace("200ms", "1s")))
    assert det.config.metrics_staleness_threshold == 1.0


def test_plugins_without_profiles_form_a_default_profile() -> None:
    assert weights("plugins:\n- type: queue-scorer\n") == {"queue-scorer": 1.0}


def test_a_profile_without_scorers_says_its_picks_are_random() -> None:
    """A config listing only an admitter gets a default profile with no scorer, as upstream's
    loader builds it: every endpoint ties. Nobody means that, so it is a warning; a profile
    with a scorer, or a random picker chosen on purpose, says nothing."""
    from structlog.testing import capture_logs

    def warned(text: str) -> list[str]:
        with capture_logs() as logs:
            build_scheduler(parse_config(text))
        return [e["profile"] for e in logs if "has no scorer" in e["event"]]

    assert warned("plugins:\n- type: token-budget-admitter\n"
                  "  parameters: {tenants: {noisy: 1}}\n") == ["default"]
    assert warned("plugins:\n- type: queue-scorer\n") == []
    assert warned("plugins:\n- type: random-picker\n") == []
    assert warned("") == []


def test_unknown_plugin_type_names_it() -> None:
    with pytest.raises(ConfigError, match="unknown plugin type 'magic-scorer'"):
        build_scheduler(parse_config("plugins:\n- type: magic-scorer\n"))


def test_negative_weight_is_rejected_with_its_location() -> None:
    text = UPSTREAM.replace("weight: 3", "weight: -1")
    with pytest.raises(ConfigError, match=r"schedulingProfiles\[0\]\.plugins\[2\]\.weight"):
        parse_config(text)


@pytest.mark.parametrize("weight", [".inf", "-.inf", ".nan"])
def test_a_weight_that_is_not_finite_is_rejected(weight: str) -> None:
    text = UPSTREAM.replace("weight: 3", f"weight: {weight}")
    with pytest.raises(ConfigError, match=r"plugins\[2\]\.weight: must be a finite number"):
        parse_config(text)


def test_non_numeric_weight_is_rejected() -> None:
    with pytest.raises(ConfigError, match="weight"):
        parse_config(UPSTREAM.replace("weight: 3", "weight: high"))


def test_bad_yaml_says_so() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_config("plugins: [\n")


def test_reference_to_undefined_plugin_is_rejected() -> None:
    text = UPSTREAM.replace("pluginRef: max-score-picker", "pluginRef: nope")
    with pytest.raises(ConfigError, match="no plugin named 'nope'"):
        parse_config(text)


def test_wrong_parameter_type_names_plugin_and_parameter() -> None:
    text = "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: many}\n"
    with pytest.raises(ConfigError, match="maxNumOfEndpoints"):
        build_scheduler(parse_config(text))


def test_two_pickers_in_a_profile_are_rejected() -> None:
    text = """\
plugins:
- type: max-score-picker
- type: random-picker
schedulingProfiles:
- name: p
  plugins: [{pluginRef: max-score-picker}, {pluginRef: random-picker}]
"""
    with pytest.raises(ConfigError, match="two pickers"):
        build_scheduler(parse_config(text))


def test_wrong_api_version_is_rejected() -> None:
    with pytest.raises(ConfigError, match="apiVersion"):
        parse_config("apiVersion: v9\nkind: EndpointPickerConfig\n")


def test_unreadable_config_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        load_config_file(tmp_path / "missing.yaml")


def test_legacy_decision_tree_profile_loads() -> None:
    text = """\
plugins:
- type: legacy-decision-tree-filter
- type: random-picker
schedulingProfiles:
- name: legacy
  plugins: [{pluginRef: legacy-decision-tree-filter}, {pluginRef: random-picker}]
"""
    s = build_scheduler(parse_config(text))
    assert [f.type_name for f in s.profiles["legacy"].filters] == ["legacy-decision-tree-filter"]


@pytest.mark.parametrize(("text", "seconds"), [("200ms", 0.2), ("1m30s", 90.0), (2, 2.0)])
def test_go_durations_parse(text: str | int, seconds: float) -> None:
    assert parse_duration(text, "x") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "5 parsecs", "", True])
def test_bad_durations_are_config_errors(text: object) -> None:
    with pytest.raises(ConfigError, match="must be a duration like 200ms"):
        parse_duration(text, "saturationDetector.metricsStalenessThreshold")


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_empty_config_file_is_an_error_naming_the_file(tmp_path: Path, text: str) -> None:
    """Issue 31: an empty file (a ConfigMap key gone wrong) was taken silently as default."""
    path = tmp_path / "epp.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"{path}: the file is empty"):
        load_config_file(path)
