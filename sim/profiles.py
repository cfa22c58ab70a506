"""Hardware/model profiles: the numbers that shape a simulated server's timing and capacity.

All durations are in seconds of *model time*; :attr:`sim.config.ServerConfig.time_scale`
multiplies them when a server runs. See ``sim/README.md`` for where the numbers come from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Profile:
    """Timing and capacity of one simulated model server.

    Timing model (per engine step; the one function is :func:`sim.costs.step_time`)::

        factor   = 1 + (load_factor - 1) * running / max_num_seqs
        step     = (factor * (inter_token_latency
                              + kv_read_time_per_token * decode_context   if any decodes
                              + prefill_overhead
                              + prefill_tokens * prefill_time_per_token
                              + prefill_attention_time * attention        if any prefills)
                    + lora_load_time * adapters_loaded_this_step) / speed

    ``decode_context`` is the summed context of the decoding requests, ``attention`` the sum
    over prompt chunks of ``(start + chunk)^2 - start^2`` (a whole prompt of L tokens: L^2).

    ``prefill_tokens`` is bounded by the step's token budget, vLLM V1's
    ``max_num_batched_tokens`` (decodes take one token each, prefills share the rest; with
    ``enable_chunked_prefill`` a prompt that does not fit is split over several steps).
    A step that admits requests with multimodal items adds ``encode_time_per_image`` for each
    item not in the encoder cache (``ec_load_time_per_image`` when an encode server already
    encoded it, E/PD and E/P/D).
    """

    name: str
    inter_token_latency: float
    prefill_overhead: float
    prefill_time_per_token: float
    load_factor: float
    max_num_seqs: int
    max_waiting: int
    block_size: int
    num_gpu_blocks: int
    max_model_len: int
    max_loras: int
    lora_load_time: float
    default_max_tokens: int
    #: vLLM V1's per-step token budget (``--max-num-batched-tokens``).
    max_num_batched_tokens: int = 8192
    #: vLLM V1's default; False: a prompt is prefilled whole (admission stops at the first
    #: prompt that does not fit the step's budget, unless the step is otherwise empty).
    enable_chunked_prefill: bool = True
    #: Seconds per context token per decode step: reading a decoding request's KV cache
    #: (0: decode steps do not grow with context, the ``8b-h100`` model).
    kv_read_time_per_token: float = 0.0
    #: Seconds per token^2 of causal attention in prefill: a prompt of L tokens costs
    #: ``prefill_attention_time * L^2`` on top of its linear per-token cost (0: none).
    prefill_attention_time: float = 0.0
    #: Relative speed of this server: every step takes ``1 / speed`` of the time the other
    #: fields give (2.0: twice as fast; 0.5: half). The one knob for a heterogeneous pool
    #: of otherwise alike servers, e.g. ``overrides: {speed: 0.6}`` in a fleet file.
    speed: float = 1.0
    #: Multimodal: seconds of the vision encoder per image (video, audio item) it has not
    #: encoded before, added to the step that admits the request (the encoder runs on the
    #: same GPU, in the step, as in vLLM V1).
    encode_time_per_image: float = 0.040
    #: Items the encoder cache keeps (LRU); an item found there is not encoded again.
    encoder_cache_items: int = 512
    #: Seconds to load one item's embedding that an encode server wrote through the EC
    #: connector (``ec_transfer_config``) instead of encoding it here.
    ec_load_time_per_image: float = 0.002

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be positive")
        if self.speed <= 0:
            raise ValueError("speed must be positive")
        if self.kv_read_time_per_token < 0 or self.prefill_attention_time < 0:
            raise ValueError("kv_read_time_per_token and prefill_attention_time must be >= 0")
        if self.encoder_cache_items < 0:
            raise ValueError("encoder_cache_items cannot be negative")

    def with_overrides(self, overrides: dict[str, Any]) -> Profile:
        """A copy with some fields replaced; unknown field names raise ``ValueError``."""
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(f"unknown profile field(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **overrides)


#: Llama-3.1-8B on one H100 80GB. ITL, prefill overhead, per-token prefill and load factor are
#: the calibration quoted in REFERENCE.md ("8B on H100"); capacity follows from the hardware:
#: KV per token = 2 (K,V) x 32 layers x 8 KV heads x 128 dims x 2 B = 128 KiB, ~56 GiB free after
#: weights at 0.9 GPU memory utilisation -> ~450k tokens -> 28,000 blocks of 16.
#: max_num_seqs = 256 is vLLM's long-standing default. max_num_batched_tokens = 8192 and
#: chunked prefill on are vLLM V1's defaults for its OpenAI server on a GPU with >= 70 GiB
#: that is not an A100 (``EngineArgs`` batch defaults).
H100_8B = Profile(
    name="8b-h100",
    inter_token_latency=0.012,
    prefill_overhead=0.030,
    prefill_time_per_token=0.000250,
    load_factor=2.0,
    max_num_seqs=256,
    max_waiting=4096,
    block_size=16,
    num_gpu_blocks=28_000,
    max_model_len=32_768,
    max_loras=4,
    lora_load_time=0.050,
    default_max_tokens=128,
)

#: A small, fast server for tests: a handful of slots and a cache that fills up quickly.
TINY = Profile(
    name="tiny",
    inter_token_latency=0.002,
    prefill_overhead=0.002,
    prefill_time_per_token=0.00005,
    load_factor=2.0,
    max_num_seqs=4,
    max_waiting=16,
    block_size=16,
    num_gpu_blocks=256,
    max_model_len=4096,
    max_loras=2,
    lora_load_time=0.005,
    default_max_tokens=16,
    # vLLM V1's OpenAI-server default on smaller GPUs.
    max_num_batched_tokens=2048,
)

#: The shape of llm-d-inference-sim's defaults: few concurrent sequences, so queueing shows up
#: at low offered load (useful to exercise queue-aware scheduling).
SMALL_BATCH = dataclasses.replace(H100_8B, name="8b-h100-small-batch", max_num_seqs=5,
                                  num_gpu_blocks=1024, max_waiting=1024)

# -- Calibrated profiles (issue #28): decode grows with context, prefill has an attention
# term. Sources and arithmetic: sim/README.md, "Calibrated profiles". In short:
#   decode: vLLM 0.4.2, Llama-3-8B, H800 (H100 silicon), batch 1: TPOT 8.66 ms at a 1k
#     prompt, 30 ms at 200k (lmdeploy issue #1608) -> 8.55 ms + 0.105 us per context token;
#   prefill: FLOPs (2 x params per token; 2 x layers x d_model per token^2 of causal
#     attention) at 55% / 40% of the H100's dense BF16 peak (989 TFLOP/s), checked against
#     NIM's 2xH100 FP8 Llama-3.3-70B TTFT (406.77 ms for 5,000 tokens, concurrency 1);
#   a100: the H100 numbers scaled by the A100's bandwidth (2.04 vs 3.35 TB/s) and dense
#     BF16 peak (312 vs 989 TFLOP/s).
_H100_ITL_8B = 0.00855
_H100_KV_8B = 1.05e-7         # s per context token per step (128 KiB of KV per token)
_H100_PREFILL_8B = 2.95e-5    # 2 x 8.03e9 FLOP / (0.55 x 989e12 FLOP/s)
_H100_ATTN_8B = 6.63e-10      # 2 x 32 x 4096 FLOP / (0.40 x 989e12 FLOP/s), per token^2

#: Llama-3.1-8B (BF16) on one H100 80GB, vLLM V1 defaults; capacity as ``8b-h100``.
H100_LLAMA8B = dataclasses.replace(
    H100_8B, name="h100-llama8b", inter_token_latency=_H100_ITL_8B,
    prefill_overhead=_H100_ITL_8B,   # a prefill step reads the weights once, as a decode does
    prefill_time_per_token=_H100_PREFILL_8B, kv_read_time_per_token=_H100_KV_8B,
    prefill_attention_time=_H100_ATTN_8B)

#: Llama-3.1-70B, FP8 weights, tensor-parallel over 2 x H100 80GB (NIM's published setup).
#: ITL 17.9 ms and 69.5 us per prompt token reproduce NIM's 18.58 ms ITL and 406.77 ms TTFT
#: at 5,000 prompt tokens; KV 320 KiB per token split over 2 GPUs (1.25 x the 8B's per GPU);
#: attention 2 x 80 x 8192 FLOP per token^2 over 2 GPUs at 40% of peak. KV room: 2 x 80 GB x
#: 0.9 - 70 GB of weights - ~8 GB of activations ~= 66 GB -> ~210k tokens -> 13,000 blocks.
H100_LLAMA70B = dataclasses.replace(
    H100_LLAMA8B, name="h100-llama70b", inter_token_latency=0.0179, prefill_overhead=0.0179,
    prefill_time_per_token=6.95e-5, kv_read_time_per_token=1.31e-7,
    prefill_attention_time=1.657e-9, num_gpu_blocks=13_000)

_A100_BW = 3.35 / 2.039        # H100 SXM / A100 80GB SXM HBM bandwidth
_A100_FLOPS = 989.0 / 312.0    # dense BF16 peak
#: Llama-3.1-8B (BF16) on one A100 80GB: decode scaled by bandwidth, prefill by compute;
#: vLLM V1's token budget on an A100 is 2,048.
A100_LLAMA8B = dataclasses.replace(
    H100_LLAMA8B, name="a100-llama8b", inter_token_latency=_H100_ITL_8B * _A100_BW,
    prefill_overhead=_H100_ITL_8B * _A100_BW,
    prefill_time_per_token=_H100_PREFILL_8B * _A100_FLOPS,
    kv_read_time_per_token=_H100_KV_8B * _A100_BW,
    prefill_attention_time=_H100_ATTN_8B * _A100_FLOPS, max_num_batched_tokens=2048)

PROFILES: dict[str, Profile] = {p.name: p for p in (H100_8B, TINY, SMALL_BATCH, H100_LLAMA8B,
                                                    H100_LLAMA70B, A100_LLAMA8B)}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ``ValueError`` names the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown profile {name!r} (known: {', '.join(sorted(PROFILES))})"
        ) from None
