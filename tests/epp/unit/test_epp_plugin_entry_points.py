"""Third-party plugins arrive through the ``inference_gateway.plugins`` entry-point group."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from epp.config import BUILTIN_PLUGINS, build_scheduler, parse_config
from epp.scheduling import PluginRegistry

PLUGIN_SOURCE = '''
from epp.scheduling import Scorer

class ConstantScorer(Scorer):
    type_name = "constant-scorer"
    bounded = True

    def score(self, request, endpoints):
        return [0.5] * len(endpoints)
'''


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A real distribution on sys.path declaring one entry point."""
    (tmp_path / "third_party_scorer.py").write_text(PLUGIN_SOURCE)
    dist = tmp_path / "third_party_scorer-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: third-party-scorer\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[inference_gateway.plugins]\nconstant-scorer = third_party_scorer:ConstantScorer\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("third_party_scorer", None)


@pytest.mark.usefixtures("installed_plugin")
def test_entry_point_plugin_is_usable_from_config() -> None:
    scheduler = build_scheduler(parse_config("plugins:\n- type: constant-scorer\n"),
                                registry=PluginRegistry(BUILTIN_PLUGINS))
    assert [p.type_name for p in scheduler.plugins if p.type_name == "constant-scorer"] == [
        "constant-scorer"]
