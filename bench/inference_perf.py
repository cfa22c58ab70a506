"""inference-perf (the load generator upstream GIE and llm-d publish results with) against
``make run``: its own venv, a small local tokenizer, configs shaped like our workloads.

    make run                                       # in one terminal: the local gateway
    python -m bench.inference_perf install         # once: venv + tokenizer under .cache/
    python -m bench.inference_perf run --workload shared-prefix --rate 4 --duration 30

inference-perf needs Python >= 3.12 (found as ``python3.13`` / ``python3.12`` on PATH, in
pyenv, or given with ``INFERENCE_PERF_PYTHON``) and a tokenizer it can load offline. The
tokenizer made here is a word-level Hugging Face tokenizer over every 3-letter lowercase word
(17,576 words, whitespace-split): a token it generates decodes to "abc " - 4 bytes, exactly
one token for the simulator (``sim/tokenizer.py``) - so inference-perf's token counts and the
simulator's agree. Its configs (``bench/inference_perf/*.yaml`` are written from the
workload files) keep our shapes; how its report lines up with ours: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.workloads import MODEL, WORKLOADS

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".cache" / "inference-perf"
TOKENIZER = ROOT / ".cache" / "inference-perf-tokenizer"
REPORTS = ROOT / ".cache" / "inference-perf-reports"
PACKAGE = "inference-perf"

_TOKENIZER_SCRIPT = """
import itertools, string, sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = ["".join(w) for w in itertools.product(string.ascii_lowercase, repeat=3)]
vocab = {"<unk>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
fast.save_pretrained(sys.argv[1])
"""


def find_python() -> str | None:
    """A Python >= 3.12 interpreter for inference-perf's venv, or None."""
    candidates = [os.environ.get("INFERENCE_PERF_PYTHON", ""),
                  shutil.which("python3.13") or "", shutil.which("python3.12") or ""]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv.is_dir():
        candidates += [str(p / "bin" / "python3") for p in sorted(pyenv.iterdir(), reverse=True)]
    for c in candidates:
        if not c:
            continue
        probe = subprocess.run([c, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return c
    return None


def installed() -> bool:
    """True when the venv has inference-perf and the tokenizer is there."""
    return (VENV / "bin" / "inference-perf").exists() and (TOKENIZER / "tokenizer.json").exists()


def install() -> None:
    """Create the venv, install inference-perf, write the tokenizer (idempotent)."""
    if not (VENV / "bin" / "inference-perf").exists():
        python = find_python()
        if python is None:
            sys.exit("inference-perf needs Python >= 3.12: none found on PATH or in pyenv; "
                     "set INFERENCE_PERF_PYTHON")
        subprocess.run([python, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", PACKAGE], check=True)
    if not (TOKENIZER / "tokenizer.json").exists():
        subprocess.run([str(VENV / "bin" / "python"), "-c", _TOKENIZER_SCRIPT, str(TOKENIZER)],
                       check=True)
    print(f"inference-perf ready in {VENV}; tokenizer {TOKENIZER}")


def _lognormal(median: float, sigma: float, lo: float, hi: float) -> dict[str, Any]:
    import math

    mean = median * math.exp(sigma ** 2 / 2)
    std = mean * math.sqrt(math.exp(sigma ** 2) - 1)
    return {"type": "lognormal", "mean": round(mean), "std_dev": round(std),
            "min": int(lo), "max": int(hi)}


def config(workload: str, url: str, rate: float, duration: int, out: Path) -> dict[str, Any]:
    """An inference-perf config with the shape of our ``workload``."""
    wl = WORKLOADS[workload]
    p = wl.parameters
    data: dict[str, Any]
    if wl.generator == "shared-prefix":
        groups = max(1, round(rate * duration / p["per_group"]))
        data = {"type": "shared_prefix", "shared_prefix": {
            "num_groups": groups, "num_prompts_per_group": int(p["per_group"]),
            "system_prompt_len": int(p["system_tokens"]),
            "question_len": int(p["question_tokens"]), "output_len": int(p["output_tokens"]),
            "seed": 0}}
    elif wl.generator == "lengths":
        data = {"type": "synthetic",
                "input_distribution": _lognormal(p["input_median"], p["input_sigma"],
                                                 p["input_min"], p["input_max"]),
                "output_distribution": _lognormal(p["output_median"], p["output_sigma"], 4,
                                                  p["output_max"])}
    else:
        raise SystemExit(f"--workload: {workload!r} has no inference-perf equivalent here "
                         "(shared-prefix, sharegpt, long-input do)")
    return {
        "api": {"type": "completion", "streaming": True},
        "data": data,
        "load": {"type": "poisson", "stages": [{"rate": rate, "duration": duration}],
                 "num_workers": 2},
        "server": {"type": "vllm", "model_name": MODEL, "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(TOKENIZER)},
        "report": {"request_lifecycle": {"summary": True, "per_stage": True,
                                         "per_request": False},
                   "prometheus": None},
        "storage": {"local_storage": {"path": str(out)}},
    }


def run(workload: str, url: str, rate: float, duration: int) -> Path:
    """Write the config and run inference-perf; returns the report directory."""
    if not installed():
        sys.exit("inference-perf is not installed: python -m bench.inference_perf install")
    out = REPORTS / f"{workload}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "config.yaml"
    cfg.write_text(yaml.safe_dump(config(workload, url, rate, duration, out), sort_keys=False))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([str(VENV / "bin" / "inference-perf"), "--config_file", str(cfg)],
                   check=True, env=env, cwd=out)
    print(summary_line(out / "summary_lifecycle_metrics.json"))
    print(f"reports: {out}")
    return out


def summary_line(path: Path) -> str:
    """inference-perf's summary in the terms of our tables (wall seconds: divide by the
    stack's simulator time scale for model seconds)."""
    import json

    s = json.loads(path.read_text())["successes"]
    lat, tp = s["latency"], s["throughput"]
    return (f"ok {s['count']}  TTFT p50 {lat['time_to_first_token']['median']:.3f} "
            f"p90 {lat['time_to_first_token']['p90']:.3f} s  e2e p90 "
            f"{lat['request_latency']['p90']:.2f} s  {tp['output_tokens_per_sec']:.0f} out tok/s "
            f"{tp['requests_per_sec']:.2f} req/s (wall seconds)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.inference_perf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="venv + inference-perf + the local tokenizer")
    r = sub.add_parser("run", help="run a workload against a running gateway")
    r.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway (make run)")
    r.add_argument("--workload", default="shared-prefix",
                   choices=["shared-prefix", "sharegpt", "long-input"])
    r.add_argument("--rate", type=float, default=4.0, help="requests per second (Poisson)")
    r.add_argument("--duration", type=int, default=30, help="seconds")
    args = ap.parse_args(argv)
    if args.cmd == "install":
        install()
    else:
        run(args.workload, args.url, args.rate, args.duration)
    return 0


if __name__ == "__main__":
    sys.exit(main())
