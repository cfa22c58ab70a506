"""Start a rendered Deployment's container as a local process, as kubelet would start it.

The container's ``command`` resolves to this virtualenv's console script of that name; its
``args`` are used as rendered; ``env`` entries with ``value`` or the downward-API fields the
charts use are set; ConfigMap and Secret volumes are written to a directory and the mount
path in the args points there. Kubernetes access goes to the fake API server through ``KUBECONFIG``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.charts.kubelet import run_probe
from tests.charts.render import one
from tests.support.fake_apiserver import FakeApiServer, kubeconfig


class LocalPod:
    """One container of a rendered Deployment, running on loopback."""

    def __init__(self, objs: list[dict[str, Any]], container: dict[str, Any], *,
                 apiserver: FakeApiServer | None, workdir: Path, pod_name: str,
                 secrets: dict[str, dict[str, str]] | None = None,
                 deployment: str | None = None) -> None:
        """``secrets``: the data of Secrets the pod mounts, by name (what the API server
        would hold, e.g. a token the service-account controller filled in). ``deployment``:
        the Deployment's name, when the release renders more than one."""
        self.container = container
        self.workdir = workdir
        self.log_path = workdir / f"{pod_name}.log"
        dep = one(objs, "Deployment", deployment)
        namespace = dep["metadata"]["namespace"]
        # The downward-API fields the charts read, as they are for this local pod.
        fields = {"metadata.name": pod_name, "metadata.namespace": namespace,
                  "spec.nodeName": "local-node"}
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if apiserver is not None:
            env["KUBECONFIG"] = str(kubeconfig(workdir / "kubeconfig", apiserver))
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = str(e["value"])
            else:
                env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        args = [str(a) for a in container.get("args", [])]
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                data = one(objs, "ConfigMap", volume["configMap"]["name"])["data"]
            elif "secret" in volume:
                data = (secrets or {})[volume["secret"]["secretName"]]
            else:
                continue  # emptyDir: the process uses the real /tmp
            local = workdir / mount["name"]
            local.mkdir(exist_ok=True)
            for key, text in data.items():
                (local / key).write_text(text)
            args = [a.replace(mount["mountPath"].rstrip("/") + "/", f"{local}/") for a in args]
        (command,) = container["command"]
        binary = Path(sys.executable).parent / command
        assert binary.is_file(), f"no console script {command!r} in this virtualenv"
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen([str(binary), *args], stdout=log,
                                         stderr=subprocess.STDOUT, env=env)

    def probe(self, kind: str) -> tuple[bool, str]:
        """Run the container's ``livenessProbe``/``readinessProbe``/``startupProbe`` once."""
        if self.proc.poll() is not None:
            raise AssertionError(f"process exited {self.proc.returncode}: {self.log_tail()}")
        return run_probe(self.container[kind], self.container)

    def wait_probe(self, kind: str, *, passing: bool = True, attempts: int = 150) -> str:
        """Probe every ``periodSeconds`` (capped at 0.2 s here) until it passes (or fails);
        kubelet would keep probing forever, the test gives up after ``attempts``."""
        period = min(float(self.container[kind].get("periodSeconds", 10)), 0.2)
        seen = ""
        for _ in range(attempts):
            ok, seen = self.probe(kind)
            if ok == passing:
                return seen
            time.sleep(period)
        raise AssertionError(f"{kind} never {'passed' if passing else 'failed'} (last: {seen})"
                             f"\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
