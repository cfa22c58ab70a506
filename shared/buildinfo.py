"""What build is running: the package version and, when it can be known, the git commit.

Both services export them in their info gauge (``inference_extension_info{commit,
build_ref}``, ``bbr_info{version, commit}``). The commit comes from ``BUILD_COMMIT`` (set by
an image build: ``docker build --build-arg BUILD_COMMIT=$(git rev-parse HEAD)``) or, for a
source checkout (``pip install -e``), from the checkout's ``.git`` read as files: no ``git``
binary is needed or started.
"""

from __future__ import annotations

import os
import re
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from pathlib import Path

DISTRIBUTION = "inference-gateway-py"
UNKNOWN = "unknown"
_SHA = re.compile(r"^[0-9a-f]{40}$")


def version() -> str:
    """The installed distribution's version, ``dev`` when it is not installed."""
    try:
        return _dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "dev"


def commit(source: Path | None = None) -> str:
    """The commit this code was built from, or ``unknown``."""
    env = os.environ.get("BUILD_COMMIT", "").strip()
    if env:
        return env
    root = source if source is not None else Path(__file__).resolve().parent.parent
    return _git_head(root) or UNKNOWN


def _git_head(root: Path) -> str | None:
    """HEAD's commit of the checkout at ``root`` (a worktree's ``.git`` file included)."""
    try:
        dot_git = root / ".git"
        if dot_git.is_file():  # a worktree: "gitdir: <path>"
            dot_git = (root / dot_git.read_text().split(":", 1)[1].strip()).resolve()
        head = (dot_git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head if _SHA.match(head) else None
        ref = head.removeprefix("ref: ")
        common = dot_git
        if (dot_git / "commondir").is_file():
            common = (dot_git / (dot_git / "commondir").read_text().strip()).resolve()
        for base in (dot_git, common):
            if (base / ref).is_file():
                sha = (base / ref).read_text().strip()
                return sha if _SHA.match(sha) else None
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                sha, _, name = line.partition(" ")
                if name == ref and _SHA.match(sha):
                    return sha
    except (OSError, IndexError):
        return None
    return None
