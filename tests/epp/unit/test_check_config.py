"""``epp --check-config``: validates a config the way ``envoy --mode validate`` does, exits 0
when it is usable and 1 with a one-line reason naming the file and the place in it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

UPSTREAM_V15 = Path(__file__).parents[1] / "data" / "upstream-v1.5.0-default-plugins.yaml"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epp.main", "--check-config", *args],
                          capture_output=True, text=True, timeout=60)


def test_upstream_v15_chart_config_is_valid() -> None:
    proc = check(str(UPSTREAM_V15))
    assert (proc.returncode, proc.stdout.strip()) == (0, "epp: EndpointPickerConfig is valid")


def test_a_typod_parameter_fails_with_one_line_naming_file_and_parameter(tmp_path: Path) -> None:
    cfg = tmp_path / "plugins.yaml"
    cfg.write_text(UPSTREAM_V15.read_text().replace("insecureSkipVerify", "insecureSkipVerfy"))
    proc = check(str(cfg))
    # One error line; the old config group's deprecation warning is logged beside it.
    (line,) = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("epp:")]
    assert proc.returncode == 1
    assert line.startswith(f"epp: error: bad EndpointPickerConfig: {cfg}: plugins[3]: ")
    assert "unknown parameters ['insecureSkipVerfy']" in line


def test_config_text_is_checked_too() -> None:
    proc = check("--config-text", "flowControl: {defaultRequestTTL: '30'}\n")
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith(
        "--config-text: flowControl.defaultRequestTTL: missing unit in duration '30' "
        "(use e.g. 30s, 500ms, 1m30s)")


def test_an_unreadable_file_fails_naming_it() -> None:
    proc = check("/no/such/plugins.yaml")
    assert proc.returncode == 1 and "/no/such/plugins.yaml: cannot read" in proc.stderr


def test_an_old_plugin_name_gets_a_did_you_mean_not_the_list_of_types(tmp_path: Path) -> None:
    cfg = tmp_path / "plugins.yaml"
    cfg.write_text("plugins:\n- type: kv-cache-scorer\n")
    proc = check(str(cfg))
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 1
    assert line == (f"epp: error: bad EndpointPickerConfig: {cfg}: plugins[0]: unknown plugin "
                    "type 'kv-cache-scorer'; did you mean 'kv-cache-utilization-scorer'?")


def test_a_name_like_no_type_says_where_the_types_are_listed(tmp_path: Path) -> None:
    cfg = tmp_path / "plugins.yaml"
    cfg.write_text("plugins:\n- type: zzz\n")
    line = check(str(cfg)).stderr.strip()
    assert re.search(r"unknown plugin type 'zzz' \(\d+ types are known: docs/plugins.md "
                     r"lists them\)$", line), line
    assert "queue-scorer" not in line
