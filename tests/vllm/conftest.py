"""Real vLLM behind the real gateway: collected only with ``--real-vllm`` or ``--vllm-url``.

``--real-vllm`` (``make test-vllm``) makes the tiny model with the cached vLLM venv and
starts two local CPU vLLM servers (see :mod:`tests.vllm.harness`); ``--vllm-url`` uses
servers the user already runs. Either way one Envoy + BBR + EPP (TLS to both) is put in
front, and every check prints one line.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vllm.harness import (
    MODEL,
    SHARED_STORAGE_CONNECTOR,
    Gateway,
    PDPool,
    RealPool,
    VllmServer,
    local_servers,
    served_models,
    servers_from_urls,
    start_vllm,
    stop_vllm,
)

ROOT = Path(__file__).resolve().parents[2]


def _print(config: pytest.Config, line: str) -> None:
    """One line on the terminal, on its own line, even while pytest captures output."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        if getattr(reporter._tw, "width_of_current_line", 0):
            reporter.write("\n")
        reporter.write(line + "\n", flush=True)


@pytest.fixture(scope="session")
def real(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         ) -> Iterator[RealPool]:
    config = request.config
    urls: list[str] = config.getoption("--vllm-url")
    workdir = tmp_path_factory.mktemp("real-vllm")
    venv: Path | None = None
    started = time.monotonic()
    if urls:
        servers = servers_from_urls(urls)
    else:
        venv = (ROOT / config.getoption("--vllm-venv")).resolve()
        if not (venv / "bin" / "python").exists():
            pytest.exit(f"no vLLM venv at {venv}: run `make test-vllm` (it makes one)", 2)
        model_dir = ROOT / ".cache" / "tiny-model"
        subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tests/vllm/make_model.py"),
                        str(model_dir)], check=True, env={"HF_HUB_OFFLINE": "1",
                                                          "PATH": "/usr/bin:/bin"},
                       capture_output=True)
        servers = local_servers()
        _print(config, f"starting {len(servers)} vLLM servers (CPU, in parallel; logs in "
                       f"{workdir})...")
        try:
            start_vllm(venv, model_dir, servers, workdir)
        except BaseException:
            stop_vllm(servers)
            raise
    model, _ = served_models(servers[0])
    adapters: dict[str, list[VllmServer]] = {}
    for s in servers:
        base, names = served_models(s)
        if base != model:
            pytest.exit(f"{s.url} serves {base!r}, {servers[0].url} serves {model!r}: "
                        "one pool serves one base model", 2)
        for name in names:
            adapters.setdefault(name, []).append(s)
    if not urls:
        assert model == MODEL
    gateway = Gateway(workdir / "gateway", servers, model, sorted(adapters))
    try:
        gateway.start()
    except BaseException:
        gateway.stop()
        stop_vllm(servers)
        raise
    _print(config, f"servers ready in {time.monotonic() - started:.0f}s: "
                   + ", ".join(f"{s.name}={s.url}" for s in servers)
                   + f"; gateway on {gateway.url} (Envoy + BBR + EPP, TLS)")
    yield RealPool(servers, gateway, not urls, model, adapters, workdir, venv)
    gateway.stop()
    stop_vllm(servers)


@pytest.fixture(scope="module")
def real_pd(request: pytest.FixtureRequest, real: RealPool) -> Iterator[PDPool]:
    """The P/D pair with the shared-storage KV connector behind a gateway of its own (see
    :class:`tests.vllm.harness.PDPool`), started when the P/D check first asks for it."""
    if not real.local or real.venv is None:
        pytest.skip("local servers only: needs two vLLM servers started with the "
                    "shared-storage KV connector (docs/real-vllm.md)")
    pd = PDPool.local(real.workdir / "pd", real.model)
    started = time.monotonic()
    _print(request.config, "starting the P/D pair (vLLM prefiller + decoder with "
                           f"{SHARED_STORAGE_CONNECTOR}, pd-sidecar)...")
    try:
        pd.start(real.venv, ROOT / ".cache" / "tiny-model")
    except BaseException:
        pd.stop()
        raise
    assert pd.gateway is not None
    _print(request.config, f"P/D pair ready in {time.monotonic() - started:.0f}s: prefill="
                           f"{pd.prefiller.url}, decode={pd.decoder.url} behind the sidecar "
                           f"on {pd.decode_pod.url}; gateway on {pd.gateway.url}")
    yield pd
    pd.stop()


_CONFIG: list[pytest.Config] = []
#: Seconds per check, server start-up included (the first check pays it): vLLM takes ~35 s
#: to start alone and several minutes while seven other jobs share two cores.
CHECK_TIMEOUT = 1800


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    asked = config.getoption("--real-vllm") or config.getoption("--vllm-url")
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.timeout(CHECK_TIMEOUT))
            if not asked:  # `pytest tests/vllm` alone: the root conftest only ignores the dir
                item.add_marker(pytest.mark.skip(
                    reason="real vLLM needed: `make test-vllm`, or --vllm-url http://HOST:PORT"))


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG.append(config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One line per check: its outcome and the first line of its docstring."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        doc = getattr(report, "check_doc", "") or report.nodeid.rsplit("::", 1)[-1]
        outcome = "skipped" if report.skipped else report.outcome
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = f" ({report.longrepr[2].removeprefix('Skipped: ')})"
        if _CONFIG:
            _print(_CONFIG[-1], f"check {outcome:7} {doc}{reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    outcome: Any = yield
    report = outcome.get_result()
    doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
    report.check_doc = doc.strip().splitlines()[0] if doc.strip() else ""
