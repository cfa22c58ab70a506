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

    Timing model (per engine step, see :mod:`sim.engine`)::

        factor   = 1 + (load_factor - 1) * running / max_num_seqs
        step     = factor * (inter_token_latency            if any request decodes
                             + prefill_overhead
                             + prefill_tokens * prefill_time_per_token   if any prefills)
                   + lora_load_time * adapters_loaded_this_step

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

PROFILES: dict[str, Profile] = {p.name: p for p in (H100_8B, TINY, SMALL_BATCH)}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ``ValueError`` names the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown profile {name!r} (known: {', '.join(sorted(PROFILES))})"
        ) from None
