"""The build the info gauges report: ``BUILD_COMMIT`` first, else the source checkout's HEAD
read from its ``.git`` files (a plain repository, a worktree, a packed ref), else unknown."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from shared import buildinfo

SHA = "0123456789abcdef0123456789abcdef01234567"


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BUILD_COMMIT", SHA)
    assert buildinfo.commit(tmp_path) == SHA


def test_a_checkout_without_git_is_unknown(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.delenv("BUILD_COMMIT", raising=False)
    assert buildinfo.commit(tmp_path) == "unknown"


def test_head_of_a_repository_and_of_its_worktree_after_packing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("BUILD_COMMIT", raising=False)
    repo = tmp_path / "repo"

    def git(*args: str, cwd: Path = repo) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()

    repo.mkdir()
    git("init", "-q", "-b", "main")
    git("commit", "-q", "--allow-empty", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert buildinfo.commit(repo) == head
    git("worktree", "add", "-q", "-b", "other", str(tmp_path / "wt"))
    git("commit", "-q", "--allow-empty", "-m", "two", cwd=tmp_path / "wt")
    other = git("rev-parse", "HEAD", cwd=tmp_path / "wt")
    git("pack-refs", "--all")
    assert buildinfo.commit(tmp_path / "wt") == other != head
    assert buildinfo.commit(repo) == head


def test_the_version_is_the_installed_one() -> None:
    from importlib.metadata import version

    assert buildinfo.version() == version("inference-gateway-py")
