"""inference-perf configs for our workloads: the shapes carry over, and inference-perf's own
config model accepts them (when its venv is installed: `python -m bench.inference_perf
install`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.inference_perf import TOKENIZER, VENV, config, installed


def test_configs_keep_our_workload_shapes(tmp_path: Path) -> None:
    sp = config("shared-prefix", "http://127.0.0.1:8080", 4.0, 30, tmp_path)
    assert sp["data"]["shared_prefix"] == {
        "num_groups": 24, "num_prompts_per_group": 5, "system_prompt_len": 6000,
        "question_len": 1200, "output_len": 100, "seed": 0}
    assert sp["load"]["stages"] == [{"rate": 4.0, "duration": 30}]
    assert sp["api"] == {"type": "completion", "streaming": True}
    rag = config("long-input", "http://x", 1.0, 10, tmp_path)["data"]["input_distribution"]
    assert rag["type"] == "lognormal" and (rag["min"], rag["max"]) == (4000, 16000)
    with pytest.raises(SystemExit, match="lora"):
        config("lora", "http://x", 1.0, 10, tmp_path)


def test_inference_perf_accepts_the_configs_and_the_tokenizer_counts_like_the_simulator(
        tmp_path: Path) -> None:
    if not installed():
        pytest.skip("inference-perf venv not installed (python -m bench.inference_perf install)")
    cfgs = [config(w, "http://127.0.0.1:8080", 2.0, 10, tmp_path)
            for w in ("shared-prefix", "sharegpt", "long-input")]
    script = (
        "import json, sys\n"
        "from inference_perf.config.config import Config\n"
        "from transformers import AutoTokenizer\n"
        "for cfg in json.loads(sys.argv[1]):\n"
        "    Config(**cfg)\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[2])\n"
        "text = tok.decode(tok.encode('abc xyz qrs', add_special_tokens=False))\n"
        "print(len(tok.encode(text, add_special_tokens=False)), repr(text))\n")
    out = subprocess.run([str(VENV / "bin" / "python"), "-c", script, json.dumps(cfgs),
                          str(TOKENIZER)], capture_output=True, text=True, timeout=120,
                         env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    # 3 tokens that decode to 3 four-byte words (one simulator token each).
    assert out.stdout.strip().splitlines()[-1] == "3 'abc xyz qrs'"
