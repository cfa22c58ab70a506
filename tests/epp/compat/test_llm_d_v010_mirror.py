"""Every EndpointPickerConfig llm-d-router v0.10.0 ships, read from the upstream mirror and
run through our loader and builder (what ``epp --check-config`` does): each loads, or is
refused where upstream's own binary refuses it too, or waits on a named gap.

What "ships" means here: every ``kind: EndpointPickerConfig`` document in a ``.yaml`` file of
the tag (also inside ConfigMaps and helm values, as a block string) and in every fenced
block of its markdown files: 46 documents (chart templates, which are not YAML before
rendering, are left out). Measured on this branch: 38 load (6 before issue #26; the four
multimodal ones - sim-e-p-d, sim-e-pd, epp-mm-embeddings-cache and the E/P/D example of
docs/disaggregation.md - since issue #29).

The ones waiting on a plugin type another branch builds must fail on exactly that gap until
it lands, and load after.

Skipped as a whole when the mirror is not on the machine (CI): ``configs/llm-d-v0.10.yaml``
is the corpus of our own that covers the same API without it.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.config import ConfigError, build, parse_config
from epp.config.stability import ExperimentalPluginError, check_stability

MIRROR = Path("/work/.mirror/llm-d+llm-d-router/repo")
TAG = "v0.10.0"

#: Refused by upstream v0.10's own ``epp`` as well: types only its tests register, or a
#: documentation placeholder that is not a config.
UPSTREAM_REFUSES: dict[str, str] = {
    "config/charts/README.md#0.0": "unknown plugin type 'custom-scorer'",
    "docs/architecture.md#0.0": "plugins[0]: must be a mapping",
    "test/integration/epp/testdata/datalayer-config.yaml#0.0":
        "unknown plugin type 'mock-metrics-source'",
    "test/integration/epp/testdata/request-attribute-reporter-config.yaml#0.0":
        "unknown plugin type 'mock-metrics-source'",
    "test/testdata/configloader_1_test.yaml#0.0": "unknown feature gate 'test-feature-gate'",
}
#: Outside this test's scope (issue #26 leaves multimodal to its own; flow control's
#: configs, built by issue #27, load).
OUT_OF_SCOPE: dict[str, str] = {
    "pkg/epp/framework/plugins/README.md#0.0":
        "multicluster-file-discovery (multi-cluster, not in issue #26's list)",
}
#: Waiting on a plugin type or parameter another branch builds: until then the config must
#: stop on exactly this (and load once it has landed).
GAPS: dict[str, str] = {}
#: Configs that load here today (it may only grow): 40 since issue #29 built the parsers
#: (the parsers README's examples) and the multimodal/encode types.
LOADS_AT_LEAST = 40


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(MIRROR), *args], capture_output=True, text=True,
                          check=True).stdout


def _find_configs(value: Any, out: list[str]) -> None:
    """EndpointPickerConfig documents inside a parsed YAML value (also block strings)."""
    if isinstance(value, dict):
        if value.get("kind") == "EndpointPickerConfig":
            out.append(yaml.safe_dump(value, sort_keys=False))
            return
        for v in value.values():
            _find_configs(v, out)
    elif isinstance(value, list):
        for v in value:
            _find_configs(v, out)
    elif isinstance(value, str) and "EndpointPickerConfig" in value:
        out.extend(_configs_in(value) or [])


def _configs_in(text: str) -> list[str] | None:
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        return None  # a helm template before rendering
    out: list[str] = []
    for doc in docs:
        _find_configs(doc, out)
    return out


@dataclass(frozen=True)
class Shipped:
    id: str
    text: str


@cache
def shipped() -> tuple[Shipped, ...]:
    """Every EndpointPickerConfig of the tag, as ``path#block.document``."""
    listing = _git("grep", "-l", "EndpointPickerConfig", TAG, "--", "*.yaml", "*.yml", "*.md")
    out: list[Shipped] = []
    for line in listing.split():
        path = line.split(":", 1)[1]
        text = _git("show", f"{TAG}:{path}")
        blocks = ([b for b in re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
                   if "EndpointPickerConfig" in b] if path.endswith(".md") else [text])
        for i, block in enumerate(blocks):
            for j, doc in enumerate(_configs_in(block) or []):
                out.append(Shipped(f"{path}#{i}.{j}", doc))
    return tuple(out)


def outcome(cfg: Shipped) -> str | None:
    """None when the config builds (Alpha types allowed, as upstream with the flag)."""
    try:
        runtime = build(parse_config(cfg.text, source=cfg.id))
        check_stability(((p.name, p.type_name) for p in runtime.handle),
                        allow_experimental=True)
    except (ConfigError, ExperimentalPluginError) as e:
        return str(e)
    return None


needs_mirror = pytest.mark.skipif(
    not (MIRROR / "HEAD").exists() and not (MIRROR / ".git").exists(),
    reason="the llm-d-router mirror is not on this machine; configs/llm-d-v0.10.yaml "
           "covers the v0.10 API without it")


def ids() -> list[str]:
    try:
        return [c.id for c in shipped()]
    except (OSError, subprocess.CalledProcessError):
        return []


@needs_mirror
def test_the_mirror_ships_the_configs_this_test_knows() -> None:
    found = {c.id for c in shipped()}
    assert len(found) == 46
    listed = set(UPSTREAM_REFUSES) | set(OUT_OF_SCOPE) | set(GAPS)
    assert listed - found == set()  # no stale entry


@needs_mirror
@pytest.mark.parametrize("cid", ids())
def test_each_shipped_config_loads_or_is_refused_as_upstream(cid: str) -> None:
    cfg = next(c for c in shipped() if c.id == cid)
    if cid in OUT_OF_SCOPE:
        pytest.skip(OUT_OF_SCOPE[cid])
    error = outcome(cfg)
    if cid in UPSTREAM_REFUSES:
        assert error is not None and UPSTREAM_REFUSES[cid] in error, error
        assert error.startswith(cid)  # names where the config came from
        return
    if cid in GAPS:
        assert error is None or GAPS[cid] in error, error
        return
    assert error is None, error


@needs_mirror
def test_the_count_that_loads_only_grows() -> None:
    loaded = [c.id for c in shipped() if outcome(c) is None]
    assert len(loaded) >= LOADS_AT_LEAST, loaded
