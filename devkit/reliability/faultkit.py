"""Fault scenarios against a real one-pool gateway (Envoy → BBR → EPP → ``vllm-sim``): the
fleet runs in its own process and takes faults over HTTP (``/sim/kill``, ``/sim/faults``).
Used by ``tests/system/reliability/test_faults.py`` (short forms), ``bench.soak`` and
``bench.overload``; the long form of the faults is ``bench/scenarios/server-restart.yaml``."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from devkit import envoy as e
from devkit.reliability.gateway import Gateway, PoolDef, start_gateway
from devkit.stats import percentile  # noqa: F401  (the reliability tests import it from here)

MODEL = "sim-model"
OBJECTIVES = [
    {"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
     "metadata": {"name": name, "namespace": "default"},
     "spec": {"priority": priority, "poolRef": {"name": "sim"}}}
    for name, priority in (("batch", -1), ("chat", 1))
]


@dataclass
class SimFleet:
    """``vllm-sim`` serving ``n`` pods on 127.0.40.1..n, one shared port."""

    n: int
    workdir: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    max_waiting: int | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> list[str]:
        return [f"127.0.40.{i + 1}" for i in range(self.n)]

    def key(self, i: int) -> str:
        return f"{self.hosts[i]}:{self.port}"

    def start(self) -> SimFleet:
        self.port = e.free_port()
        defaults: dict[str, Any] = {"model": MODEL, "profile": "tiny", "time_scale": 1.0}
        if self.overrides:
            defaults["overrides"] = self.overrides
        cfg = {"defaults": defaults, "servers": [
            {"host": h, "port": self.port, "name": f"pod-{i}"} for i, h in enumerate(self.hosts)]}
        path = self.workdir / "fleet.yaml"
        path.write_text(yaml.safe_dump(cfg))
        args = [sys.executable, "-m", "sim.main", "--config", str(path), "--log-level",
                "warning"]
        if self.max_waiting is not None:
            args += ["--max-waiting", str(self.max_waiting)]
        with (self.workdir / "sim.log").open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        for h in self.hosts:
            e.wait_for_port(self.port, host=h, timeout=20)
        return self

    def post(self, i: int, path: str, body: dict[str, Any]) -> None:
        req = urllib.request.Request(f"http://{self.key(i)}{path}", data=orjson.dumps(body),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=5):
            pass

    def kill(self, i: int, revive_after: float) -> None:
        """Stop pod ``i`` (listener and connections closed); it comes back by itself."""
        self.post(i, "/sim/kill", {"revive_after": revive_after})

    def faults(self, i: int, **changes: Any) -> None:
        self.post(i, "/sim/faults", changes)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@dataclass(frozen=True)
class Result:
    """One request of a load run."""

    start: float
    end: float
    status: int
    pod: str
    objective: str

    @property
    def latency(self) -> float:
        return self.end - self.start


class Load:
    """Closed-loop load: ``workers`` threads each send one request after another until
    stopped; ``objective`` picks the InferenceObjective header (None: none)."""

    def __init__(self, url: str, workers: int, *, objective: str | None = None,
                 max_tokens: int = 8, stream: bool = False, timeout: float = 10.0) -> None:
        self.url = url
        self.workers = workers
        self.objective = objective
        self.max_tokens = max_tokens
        self.stream = stream
        self.timeout = timeout
        self.results: list[Result] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _run(self) -> None:
        headers = {"content-type": "application/json"}
        if self.objective:
            headers["x-gateway-inference-objective"] = self.objective
        with httpx.Client(timeout=self.timeout) as client:
            while not self._stop.is_set():
                # A new prompt each time: prefix affinity would otherwise pin the load on
                # the servers that cached the one prompt, and hide what the fault does.
                body = orjson.dumps({"model": MODEL, "max_tokens": self.max_tokens,
                                     "stream": self.stream,
                                     "prompt": f"{uuid.uuid4()} Tell me a story " * 4})
                start = time.monotonic()
                try:
                    r = client.post(self.url, content=body, headers=headers)
                    status, pod = r.status_code, r.headers.get("x-inference-pod", "")
                except httpx.HTTPError:
                    status, pod = 0, ""
                self.results.append(Result(start, time.monotonic(), status, pod,
                                           self.objective or ""))

    def start(self) -> Load:
        self._threads = [threading.Thread(target=self._run, daemon=True)
                         for _ in range(self.workers)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> list[Result]:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)
        return self.results


@contextmanager
def load(url: str, workers: int, **kw: Any) -> Iterator[Load]:
    """Run a :class:`Load` for the ``with`` block."""
    running = Load(url, workers, **kw).start()
    try:
        yield running
    finally:
        running.stop()


def start_sim_gateway(workdir: Path, fleet: SimFleet, *, mode: str = "FULL_DUPLEX_STREAMED",
                      epp_args: tuple[str, ...] = (),
                      runtime: dict[str, Any] | None = None) -> Gateway:
    """One pool ``sim`` over ``fleet`` behind BBR and Envoy (FailClose)."""
    pool = PoolDef("sim", [MODEL], [(f"pod-{i}", h) for i, h in enumerate(fleet.hosts)],
                   fleet.port, extra=OBJECTIVES)
    return start_gateway(workdir, [pool], mode=mode, epp_args=epp_args, timeout="5s",
                         runtime=runtime)


def wait_until(check: Any, timeout: float, interval: float = 0.05) -> float:
    """Poll ``check()`` until true; the seconds it took (TimeoutError after ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(interval)
    raise TimeoutError(f"not true after {timeout}s")
