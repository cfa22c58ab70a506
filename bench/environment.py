"""What a run's numbers depend on besides the scenario: versions (Python, Envoy, the peers),
the commit, the machine and its load. Saved with every run's results, printed under every
generated RESULTS.md section."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout or out.stderr).strip()


def envoy_version() -> str:
    """``envoy --version``'s version field (e.g. ``1.40.0/...``), or why there is none."""
    from devkit.envoy import envoy_binary

    try:
        binary = envoy_binary()
    except Exception as e:  # no Envoy is a fact to record, not a failure to raise
        return f"not found ({e})"
    text = _run([str(binary), "--version"])
    _, _, rest = text.partition("version:")
    fields = rest.strip().split("/")   # commit/version/Clean/RELEASE/ssl
    return f"{fields[1]} ({fields[0][:10]}, {'/'.join(fields[2:])})" if len(fields) > 2 else (
        text or "?")


def commit() -> str:
    """``HEAD``'s short hash, ``+dirty`` when the tree has changes."""
    head = _run(["git", "rev-parse", "--short=10", "HEAD"], ROOT) or "?"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], ROOT)
    return head + ("+dirty" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def capture(peers: bool = True) -> dict[str, Any]:
    """The environment now. ``peers``: also the installed peer versions (a subprocess each)."""
    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit(),
        "python": platform.python_version(),
        "envoy": envoy_version(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs "
                   f"({cpu_model()})",
        "loadavg_start": loadavg(),
        "argv": " ".join(["python -m bench" if sys.argv[0].endswith("__main__.py")
                          else sys.argv[0], *sys.argv[1:]]),
    }
    if shutil.which("nproc"):
        env["usable_cpus"] = len(os.sched_getaffinity(0))
    if peers:
        from bench.peers import PEERS

        env["peers"] = {p.name: (p.version() if p.python.exists() else "not installed")
                        + f" (pinned {p.pin})" for p in PEERS.values()}
    return env


def line(env: dict[str, Any]) -> str:
    """The environment as one Markdown sentence."""
    parts = [f"{env.get('date', '?')}", f"commit {env.get('commit', '?')}",
             f"Python {env.get('python', '?')}", f"Envoy {env.get('envoy', '?')}",
             f"{env.get('machine', '?')}",
             f"load average {env.get('loadavg_start', '?')} at the start and "
             f"{env.get('loadavg_end', '?')} at the end"]
    if env.get("peers"):
        parts.append("peers: " + ", ".join(f"{k} {v}" for k, v in env["peers"].items()))
    if env.get("budget"):
        parts.append(f"CPU budgets: {env['budget']}; background CPU burners: "
                     f"{env.get('burners', 0)}")
    return "; ".join(parts) + "."
