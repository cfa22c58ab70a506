"""Make the tiny model `make test-vllm` serves: run with the vLLM venv's Python.

    .cache/vllm-venv/bin/python tests/vllm/make_model.py OUT_DIR

Writes ``OUT_DIR/base`` (a Llama with random weights: hidden 128, 2 layers, 4 heads of size
32 — vLLM's CPU attention needs a head size of 32 to 512 — and a byte-level BPE tokenizer
trained here with ``tokenizers``, plus a chat template) and ``OUT_DIR/a1``, ``OUT_DIR/a2``
(LoRA adapters of rank 8 with random weights, made with ``peft``). Nothing comes from a hub.
Takes seconds; does nothing when ``OUT_DIR/.done`` exists.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<s>", "</s>", "<unk>", "<pad>"]
VOCABULARY = ("the a gateway model server request token cache prefix route pool endpoint picks "
              "queue running waiting adapter lora you are helpful assistant question answer "
              "number what is how why tell me about system user hello world")


def corpus(n: int = 4000) -> list[str]:
    """Varied English-like lines so the BPE learns common words and bytes."""
    rng = random.Random(19)
    words = VOCABULARY.split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 20))) for _ in range(n)]


def make_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def make_base(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(19)
    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      head_dim=32, max_position_embeddings=2048, bos_token_id=0,
                      eos_token_id=1, pad_token_id=3, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(out)
    make_tokenizer(out)


def make_adapter(base: Path, out: Path, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(base)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                     init_lora_weights=False)  # random A and B, so the adapter changes outputs
    get_peft_model(model, cfg).save_pretrained(out)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_model.py OUT_DIR")
    out = Path(sys.argv[1])
    if (out / ".done").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    make_base(out / "base")
    for i, name in enumerate(("a1", "a2")):
        make_adapter(out / "base", out / name, 100 + i)
    (out / ".done").touch()


if __name__ == "__main__":
    main()
