"""Fixtures shared by every test: a background loop and real backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import BackgroundLoop


@pytest.fixture(scope="session")
def bg() -> Iterator[BackgroundLoop]:
    """One background event loop for servers that sync tests talk to."""
    loop = BackgroundLoop()
    yield loop
    loop.close()


# --- real vLLM (``make test-vllm``): tests/vllm is collected only when asked for ---------

_VLLM_DIR = Path(__file__).resolve().parent / "vllm"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("real-vllm", "checks against real vLLM servers (make test-vllm)")
    group.addoption("--real-vllm", action="store_true",
                    help="run tests/vllm: start local CPU vLLM servers from the cached venv")
    group.addoption("--vllm-url", action="append", default=[], metavar="http://HOST:PORT",
                    help="run tests/vllm against vLLM servers you already run (repeatable)")
    group.addoption("--vllm-venv", default=".cache/vllm-venv",
                    help="the vLLM venv tests/vllm/setup_venv.sh made (local servers only)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave tests/vllm out of ``make test`` unless --real-vllm or --vllm-url is given."""
    if collection_path == _VLLM_DIR:
        return not (config.getoption("--real-vllm") or config.getoption("--vllm-url"))
    return None
