"""Every EndpointPickerConfig the docs show is one ``epp --check-config`` accepts: each
```yaml block in docs/*.md and README.md that declares the kind or any of its top-level keys
is written to a file and checked by the real command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
FENCE = re.compile(r"^```ya?ml[^\n]*\n(.*?)^```", re.S | re.M)
#: What marks a block as an EndpointPickerConfig (a whole one or the part a page is about).
CONFIG = re.compile(r"^(kind: EndpointPickerConfig|plugins:|schedulingProfiles:|featureGates:|"
                    r"flowControl:|saturationDetector:|dataLayer:)", re.M)


def blocks() -> list[tuple[str, str]]:
    out = []
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if CONFIG.search(m.group(1)):
                line = text[:m.start()].count("\n") + 1
                out.append((f"{page.relative_to(ROOT)}:{line}", m.group(1)))
    return out


BLOCKS = blocks()


def test_the_docs_show_configs() -> None:
    """The scan finds the pages' configs (flow control, P/D, plugins, SLO, precise prefix)."""
    pages = {where.split(":")[0] for where, _ in BLOCKS}
    assert {"docs/flow-control.md", "docs/pd.md", "docs/plugins.md", "docs/slo.md",
            "docs/precise-prefix.md"} <= pages


@pytest.mark.parametrize(("where", "block"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_docs_config_block_passes_check_config(tmp_path: Path, where: str, block: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(block)
    proc = subprocess.run([sys.executable, "-m", "epp.main", "--check-config", str(cfg)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, f"{where}: {proc.stderr.strip()}"
