"""The multimodal workload (issue #29) and what encoder-cache affinity changes in the twin."""

from __future__ import annotations

from collections import Counter

import pytest

import sim.engine as sim_engine
from bench.twin.epp_adapter import EppRouter
from bench.twin.loop import TwinConfig, run
from bench.workloads import MODEL, WORKLOADS
from tests.bench.test_scenarios import ROOT

CONFIGS = ROOT / "bench" / "scenarios" / "configs"


def urls(spec: object) -> list[str]:
    content = spec.body["messages"][0]["content"]  # type: ignore[attr-defined]
    assert content[0]["type"] == "text"
    return [b["image_url"]["url"] for b in content[1:]]


def test_chat_with_one_to_four_images_thirty_percent_repeated() -> None:
    wl = WORKLOADS["multimodal"]
    specs = wl.schedule(0.7, 30, seed=3, servers=8)
    assert specs == wl.schedule(0.7, 30, seed=3, servers=8)  # seeded
    counts = Counter(len(urls(s)) for s in specs)
    assert set(counts) == {1, 2, 3, 4}
    seen: set[str] = set()
    repeated = total = 0
    for s in specs:
        u = urls(s)
        assert len(set(u)) == len(u)  # never twice in one request
        repeated += sum(x in seen for x in u)
        total += len(u)
        assert s.tag == ("repeat" if any(x in seen for x in u) else "new")
        seen.update(u)
    assert repeated / total == pytest.approx(0.3, abs=0.04)


def test_encoder_cache_affinity_encodes_fewer_images_in_the_twin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    specs = WORKLOADS["multimodal"].schedule(0.7, 10, seed=0, servers=4)
    encoded: Counter[str] = Counter()
    original = sim_engine.Engine._encode

    def counting(self: sim_engine.Engine, req: sim_engine.SimRequest) -> float:
        before = self.encoded_items_total
        seconds = original(self, req)
        encoded[current] += self.encoded_items_total - before
        return seconds

    monkeypatch.setattr(sim_engine.Engine, "_encode", counting)
    for current in ("mm-default", "mm-cache"):
        cfg = TwinConfig(servers=4, seed=0, profile="8b-h100", model=MODEL)
        router = EppRouter(current, cfg.keys(), 0, config_file=CONFIGS / f"{current}.yaml",
                           model=MODEL)
        assert all(o.status == 200 for o in run(specs, router, cfg))
    assert encoded["mm-cache"] < 0.9 * encoded["mm-default"]
