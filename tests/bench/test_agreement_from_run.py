"""``python -m bench.twin.agreement --from-run`` replays the envoy-rr / epp-default runs of a
real-time run saved by ``python -m bench run ... --real --save`` in the twin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.twin.agreement import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_saved_real_run_is_replayed_pair_by_pair(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 4 of the saved sharegpt run (its envoy-rr and epp-default rows, real data): the
    twin is deterministic and both pairs agree within 15%."""
    saved = json.loads((ROOT / "bench/runs/sharegpt-real-8.json").read_text())
    saved["results"] = [r for r in saved["results"]
                        if r["seed"] == 4 and r["contender"] in ("envoy-rr", "epp-default")]
    run = tmp_path / "sharegpt-real-8.json"
    run.write_text(json.dumps(saved))
    assert main(["--from-run", str(run), "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "the real runs of `python -m bench run sharegpt --real --save`" in out
    assert "2 of 2 pairs agree" in out


def test_a_file_that_is_not_a_saved_run_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "results.json"
    bad.write_text('{"meta": {}, "results": []}')   # the deleted bench.compare's format
    with pytest.raises(SystemExit) as e:
        main(["--from-run", str(bad)])
    assert e.value.code == 2
    assert f"--from-run: {bad}: not a saved run (KeyError" in capsys.readouterr().err
