"""Peer routers for the comparison: installed from PyPI into their own venvs, run as-is.

vllm-router and sglang-router ship as Rust binaries inside Python wheels. They are not
project dependencies: each gets a venv under ``.cache/peers/<name>/`` (gitignored), created
on first use with ``python -m venv`` + ``pip install <package>==<pin>``: every peer is pinned
(:data:`PEERS`), so a figure names the version it measured and a re-run measures the same one
(an unpinned install once gave a vllm-router whose ``cache_aware`` routed like round-robin
next to one that did not). A venv holding another version is reinstalled. Everything that happens
(commands, exit codes, errors) is kept so a peer that cannot be installed or started here is
reported with the exact reason instead of silently dropped.

    python -m bench.peers install        # install both, print versions / errors
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where the peers' venvs live; ``BENCH_PEERS_DIR`` shares one set between checkouts.
PEERS_DIR = Path(os.environ.get("BENCH_PEERS_DIR") or ROOT / ".cache" / "peers")


@dataclass(frozen=True, slots=True)
class Peer:
    """A router distributed on PyPI: how to install it and how to start it."""

    name: str
    package: str
    module: str   # ``python -m <module>`` starts the router
    #: the exact version installed and measured
    pin: str

    @property
    def venv(self) -> Path:
        return PEERS_DIR / self.name

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def problem(self) -> str | None:
        """Why this peer cannot run here: its venv is missing, holds another version than the
        pin, or does not import the router's launcher (None: it can)."""
        if not self.python.exists():
            return f"{self.package} not installed in {self.venv}"
        if (have := self.version()) != self.pin:
            return f"{self.package} {have} installed, {self.pin} pinned"
        probe = subprocess.run([str(self.python), "-c", f"import {self.module}"],
                               capture_output=True)
        return None if probe.returncode == 0 else f"{self.package} does not import"

    def version(self) -> str:
        """The installed package version (or ``?``)."""
        out = subprocess.run(
            [str(self.python), "-c",
             f"import importlib.metadata as m; print(m.version({self.package!r}))"],
            capture_output=True, text=True)
        return out.stdout.strip() or "?"

    def install(self) -> str | None:
        """Create the venv and install the package; None on success, else the reason
        (command and the last lines of its output)."""
        if self.problem() is None:
            return None
        self.venv.parent.mkdir(parents=True, exist_ok=True)
        steps = [[sys.executable, "-m", "venv", str(self.venv)],
                 [str(self.python), "-m", "pip", "install", "-q", f"{self.package}=={self.pin}"]]
        for cmd in steps:
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
                return f"`{' '.join(cmd)}` exited {proc.returncode}: " + " / ".join(tail)
        return self.problem()

    def command(self, *, policy: str, port: int, prometheus_port: int,
                workers: list[str]) -> list[str]:
        """The router's command line over ``workers`` (regular mode: ``--worker-urls``
        and the URLs; vllm-router's PD mode: its flags, ``--prefill URL``s, ``--decode
        URL``s).

        Flags found with ``--help`` (vllm-router 0.1.x, sglang-router 0.3.x share them).
        The Prometheus port is set explicitly: both default to 29000 and the second router
        started would panic on the busy port.
        """
        return [str(self.python), "-m", self.module, "--host", "127.0.0.1",
                "--port", str(port), "--policy", policy,
                "--prometheus-port", str(prometheus_port), *workers]


PEERS: dict[str, Peer] = {
    "vllm-router": Peer("vllm-router", "vllm-router", "vllm_router.launch_router", "0.1.17"),
    "sglang-router": Peer("sglang-router", "sglang-router", "sglang_router.launch_router",
                          "0.3.2"),
}


def peer_env() -> dict[str, str]:
    """Environment for a peer process: quiet logs, no Hugging Face downloads (the
    simulated model has no tokenizer to fetch; sglang-router only warns without one)."""
    return {**os.environ, "RUST_LOG": "warn", "HF_HUB_OFFLINE": "1"}


def main() -> None:
    """``python -m bench.peers install``: install every peer and report."""
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python -m bench.peers install")
    for peer in PEERS.values():
        reason = peer.install()
        print(f"{peer.name}: " + (f"FAILED: {reason}" if reason else f"ok {peer.version()}"))


if __name__ == "__main__":
    main()
